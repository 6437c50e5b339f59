#!/bin/sh
# Puts promtool (Prometheus's rule and metrics checker, used by the tests of monitoring/) next to the venv's
# Python when it is on neither. It comes from Debian's prometheus package, unpacked rather than installed:
# installing the package would also start a Prometheus server. Idempotent; needs apt's package lists.
set -eu
bin="$1"
command -v promtool >/dev/null 2>&1 && exit 0
[ -x "$bin/promtool" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-deb >/dev/null 2>&1; then
    echo "the monitoring tests need promtool: install Prometheus's promtool and put it on the PATH" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching promtool (Debian's prometheus package, unpacked into $bin)"
if ! (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then run=""; elif sudo -n true 2>/dev/null; then run="sudo"; else run="none"; fi
    if [ "$run" = none ]; then
        echo "cannot download the prometheus package: run 'sudo apt-get update', then make setup again" >&2
        exit 1
    fi
    $run apt-get update -qq
    (cd "$work" && apt-get download -qq prometheus >/dev/null)
fi
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work" ./usr/bin/promtool
install -m 0755 "$work/usr/bin/promtool" "$bin/promtool"
