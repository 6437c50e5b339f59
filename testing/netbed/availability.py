"""Whether this machine can make a network test bed, and why not: root, the programs a bed is made of, a
TUN device, and a kernel that lets us add a namespace with a firewall rule in it."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from testing.netbed.commands import in_netns, run_command
from testing.netbed.errors import NetBedError, NetBedUnavailable
from testing.netbed.namespaces import namespace_name

PROGRAMS = {
    "ip": "iproute2",
    "tc": "iproute2",
    "iptables": "iptables",
    "conntrack": "conntrack",
}
TUN_DEVICE = Path("/dev/net/tun")


def check_netbed() -> None:
    """Return if a bed can be made here; raise :class:`NetBedUnavailable` with the reason otherwise."""
    reason = require_netbed()
    if reason is not None:
        raise NetBedUnavailable(reason)


def require_netbed() -> str | None:
    """None if a bed can be made here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "the network test bed needs root (network namespaces, iptables, tc)"
    missing = sorted({package for program, package in PROGRAMS.items() if shutil.which(program) is None})
    if missing:
        return f"the network test bed needs {', '.join(missing)} (make setup installs them)"
    if not TUN_DEVICE.exists():
        return f"the network test bed needs {TUN_DEVICE} for its delay line"
    return _kernel_refusal()


@functools.cache
def _kernel_refusal() -> str | None:
    """Try it once per process: root in a container may still be refused namespaces or netfilter."""
    name = namespace_name(0, "probe")
    try:
        run_command(["ip", "netns", "add", name])
    except NetBedError as exc:
        return f"cannot add a network namespace: {exc}"
    try:
        run_command(in_netns(name, ["iptables", "-w", "5", "-A", "INPUT", "-j", "ACCEPT"]))
    except NetBedError as exc:
        return f"cannot add an iptables rule in a network namespace: {exc}"
    finally:
        run_command(["ip", "netns", "del", name], check=False)
    return None
