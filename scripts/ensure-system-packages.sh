#!/bin/sh
# Installs the system programs msgbus runs against (redis-server, mosquitto and its clients for the router's MQTT side, a Java
# runtime for the Spark job, HAProxy, the load balancer the tests put in front of a site of several machines, and iproute2,
# iptables and conntrack for the network test bed, faketime for a site whose clock is off) when they are missing. Idempotent. The tests start their own mosquitto
# processes on free ports: the distribution's mosquitto service is not needed (on a machine with systemd it listens on 1883).
set -eu

missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v java >/dev/null 2>&1 || missing="$missing openjdk-17-jre-headless"
# Debian puts mosquitto in /usr/sbin, which is not on the PATH of most users.
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing="$missing mosquitto"
# mosquitto_pub and mosquitto_sub, for trying the router by hand (docs/router.md).
command -v mosquitto_pub >/dev/null 2>&1 || missing="$missing mosquitto-clients"
# Debian puts haproxy in /usr/sbin too.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$missing haproxy"
# The network test bed (testing/netbed): namespaces and links, the NAT gateway's firewall, its mappings.
# All three live in /usr/sbin as well.
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing="$missing iproute2"
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing="$missing iptables"
command -v conntrack >/dev/null 2>&1 || [ -x /usr/sbin/conntrack ] || missing="$missing conntrack"
# libfaketime, for the tests of a site whose clock is off (one daemon started under faketime).
command -v faketime >/dev/null 2>&1 || missing="$missing faketime"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ]; then
    run=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    run="sudo"
else
    echo "msgbus needs:$missing. Install them as root, e.g.: sudo apt-get install -y$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "msgbus needs:$missing, and this system has no apt-get: install them with its package manager." >&2
    exit 1
fi
echo "installing:$missing"
# Slim Debian images drop /usr/share/man, where the JRE's post-install step links java's man page.
case "$missing" in *openjdk*) $run mkdir -p /usr/share/man/man1 ;; esac
$run apt-get update -qq
DEBIAN_FRONTEND=noninteractive $run apt-get install -y -qq --no-install-recommends $missing >/dev/null
