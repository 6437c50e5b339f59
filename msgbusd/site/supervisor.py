"""``msgbusd --processes N``: N daemon processes of one site under one parent, sharing the listening address
(``--reuse-port``). The parent starts a process again when one dies (waiting longer while they keep dying
at once), passes SIGTERM and SIGINT on to all of them, and exits once they have all stopped. A process
that cannot start at all (a start-up error: it exits with status 1 at once) stops the whole group, with its
message on stderr."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from wire.backoff import Backoff

log = logging.getLogger("msgbusd.supervisor")

# A process that exits within this long of its start did not really run: its next start waits longer.
QUICK_EXIT_S = 10.0
RESTARTS = Backoff(0.5, 10.0)
# What msgbusd exits with on a start-up error (a wrong flag, Redis unreachable, the port taken).
STARTUP_ERROR = 1
PR_SET_PDEATHSIG = 1


def child_arguments(argv: Sequence[str]) -> list[str]:
    """The command line of one process of the group: ``argv`` without --processes, with --reuse-port."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            kept.append(arg)
    return kept if "--reuse-port" in kept else [*kept, "--reuse-port"]


def for_slot(arguments: Sequence[str], slot: int) -> list[str]:
    """The command line of the group's process number ``slot`` (from 0): its own --metrics-listen port."""
    placed = list(arguments)
    for index, arg in enumerate(placed):
        if arg == "--metrics-listen" and index + 1 < len(placed):
            placed[index + 1] = _port_plus(placed[index + 1], slot)
        elif arg.startswith("--metrics-listen="):
            placed[index] = "--metrics-listen=" + _port_plus(arg.partition("=")[2], slot)
    return placed


def _port_plus(address: str, slot: int) -> str:
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + slot}"


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, arguments: Sequence[str], processes: int) -> None:
        self._arguments = list(arguments)
        self._wanted = processes
        # Each child by pid: its process, when it started, and its slot (a restart takes the same one).
        self._children: dict[int, tuple[subprocess.Popen[bytes], float, int]] = {}
        self._quick_exits = 0
        self._stopping = 0
        self._exit_status = 0

    def _start_one(self, slot: int) -> None:
        command = [sys.executable, "-m", "msgbusd", *for_slot(self._arguments, slot)]
        # Its own process group: a terminal's Ctrl-C reaches the parent only, which passes it on once.
        child = subprocess.Popen(command, process_group=0, preexec_fn=_die_with_parent)
        self._children[child.pid] = (child, time.monotonic(), slot)

    def _signal(self, signum: int, _frame: object = None) -> None:
        self._stopping += 1
        for child, _, _ in self._children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        for slot in range(self._wanted):
            self._start_one(slot)
        log.info("started %d msgbusd processes: %s", self._wanted, sorted(self._children))
        while self._children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            entry = self._children.pop(pid, None)
            if entry is None:
                continue
            self._ended(pid, os.waitstatus_to_exitcode(status), entry[1], entry[2])
        return self._exit_status

    def _ended(self, pid: int, code: int, started: float, slot: int) -> None:
        if self._stopping:
            return
        lived_s = time.monotonic() - started
        if code == STARTUP_ERROR and lived_s < QUICK_EXIT_S:
            log.error("msgbusd process %d could not start (see its message); stopping the others", pid)
            self._exit_status = STARTUP_ERROR
            self._signal(signal.SIGTERM)
            return
        self._quick_exits = self._quick_exits + 1 if lived_s < QUICK_EXIT_S else 0
        delay = RESTARTS.delay_s(self._quick_exits) if self._quick_exits else 0.0
        how = f"signal {-code}" if code < 0 else f"status {code}"
        log.warning("msgbusd process %d ended (%s); starting another in %.1fs", pid, how, delay)
        time.sleep(delay)
        if not self._stopping:
            self._start_one(slot)


def supervise(argv: Sequence[str], processes: int) -> int:
    """Run ``processes`` msgbusd processes with the options ``argv`` until stopped; the exit status."""
    return Supervisor(child_arguments(argv), processes).run()
