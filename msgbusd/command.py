"""The ``msgbusd`` command (and ``python -m msgbusd``): the site daemon, or one line saying what to install
when the daemon's packages are not (``pip install msgbus`` is the app's install: client library and CLI)."""

from __future__ import annotations

import sys

# The project's own packages: one of them missing is a broken install, and its traceback says more.
OWN_PACKAGES = frozenset({"wire", "msgbusd", "client", "twin_resolver", "spark", "router"})
EXIT_NOT_INSTALLED = 1


def missing_daemon_package(exc: ModuleNotFoundError) -> str | None:
    """What to tell the operator when loading the daemon raised ``exc``; None when it is not a package of
    the daemon's extra that is missing."""
    package = (exc.name or "").partition(".")[0]
    if not package or package in OWN_PACKAGES:
        return None
    return (
        f"msgbusd: the site daemon's packages are not installed (no module {package!r}): "
        "pip install 'msgbus[daemon]'"
    )


def main() -> None:
    # Some of the daemon's packages are first imported once it starts, after its options are read.
    try:
        from msgbusd.site.cli import main as run_daemon

        run_daemon()
    except ModuleNotFoundError as exc:
        message = missing_daemon_package(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        sys.exit(EXIT_NOT_INSTALLED)
