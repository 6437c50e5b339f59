"""Running the system commands a bed is made of (``ip``, ``iptables``, ``tc``, ``conntrack``), inside a
namespace or not, with failures turned into :class:`~testing.netbed.errors.NetBedError`."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from testing.netbed.errors import NetBedError

# Every command a bed runs is quick; one that hangs means a wedged kernel or a held lock, not a slow step.
COMMAND_TIMEOUT_S = 20.0


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` as run inside network namespace ``netns``."""
    return ["ip", "netns", "exec", netns, *argv]


def run_command(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return its result; raise :class:`NetBedError` with its stderr if it fails and
    ``check``."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetBedError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise NetBedError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


def iptables(netns: str, *args: str, table: str = "filter") -> None:
    """One ``iptables`` command in ``netns`` (``-w``: several beds change their rules at once, and
    iptables takes one lock for the whole machine)."""
    run_command(in_netns(netns, ["iptables", "-w", "5", "-t", table, *args]))


def sysctl(netns: str, key: str, value: str | int) -> None:
    """Set ``key`` (dotted, as ``sysctl`` spells it) inside ``netns``: network sysctls are per namespace."""
    path = "/proc/sys/" + key.replace(".", "/")
    run_command(in_netns(netns, ["sh", "-c", 'echo "$1" > "$2"', "sh", str(value), path]))
