"""Network namespaces a bed owns: one :class:`Namespace` object per namespace, which runs programs in it
and, on :meth:`Namespace.close`, stops them and deletes the namespace with everything in it (its
interfaces and their peers, routes, rules, qdiscs, TUN devices).

Names are ``mbn-<pid>-<bed>-<role>``, so several test processes make beds at once without clashing, and a
bed left behind by a process that died is recognised by its dead pid and removed by
:func:`sweep_stale_namespaces` (mininet's ``mn -c``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from socket import AF_INET, SOCK_STREAM
from socket import socket as Socket
from typing import Any, TypeVar

from testing.netbed.commands import in_netns, run_command
from testing.netbed.errors import NetBedError

NAME_PREFIX = "mbn"
_NAME = re.compile(rf"^{NAME_PREFIX}-(\d+)-")
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
STOP_TIMEOUT_S = 5.0

T = TypeVar("T")


def namespace_name(bed: int, role: str) -> str:
    """The name of ``role``'s namespace in this process's bed number ``bed``."""
    return f"{NAME_PREFIX}-{os.getpid()}-{bed}-{role}"


def list_namespaces() -> list[str]:
    """The names of every named network namespace on the machine."""
    lines = run_command(["ip", "netns", "list"]).stdout.splitlines()
    return [line.split()[0] for line in lines if line.strip()]


def pids_in(netns: str) -> list[int]:
    """The processes whose network namespace is ``netns``."""
    done = run_command(["ip", "netns", "pids", netns], check=False)
    return [int(word) for word in done.stdout.split() if word.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_namespaces() -> list[str]:
    """Remove the namespaces of beds whose process is gone (with the programs still running in them);
    return their names. Namespaces of live processes, this one's included, are left alone."""
    removed = []
    for name in list_namespaces():
        found = _NAME.match(name)
        if found is None or _alive(int(found.group(1))):
            continue
        _kill_all(name)
        # Another process may be sweeping the same namespace at this moment.
        if run_command(["ip", "netns", "del", name], check=False).returncode == 0:
            removed.append(name)
    return removed


def _kill_all(netns: str) -> None:
    for pid in pids_in(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Namespace:
    """One network namespace: created by :meth:`create`, removed with all its processes by :meth:`close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._processes: list[subprocess.Popen[Any]] = []
        self._closed = False

    @classmethod
    def create(cls, name: str) -> Namespace:
        """Add the namespace ``name`` with its loopback interface up."""
        run_command(["ip", "netns", "add", name])
        namespace = cls(name)
        try:
            namespace.ip("link", "set", "lo", "up")
        except BaseException:
            namespace.close()
            raise
        return namespace

    def ip(self, *args: str) -> None:
        """One ``ip`` command applied in this namespace."""
        run_command(["ip", "-n", self.name, *args])

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside this namespace."""
        return in_netns(self.name, argv)

    def popen(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in this namespace (``options`` go to ``subprocess.Popen``); it is stopped when the
        namespace is closed."""
        process = subprocess.Popen(self.wrap(argv), **options)
        self._processes.append(process)
        return process

    def run(self, argv: Sequence[str], **options: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in this namespace to its end (``options`` go to ``subprocess.run``; by default its
        output is captured as text and a failure raises ``CalledProcessError``)."""
        options.setdefault("capture_output", True)
        options.setdefault("text", True)
        options.setdefault("check", True)
        return subprocess.run(self.wrap(argv), **options)

    def call(self, function: Callable[[], T]) -> T:
        """``function()`` run in a thread that entered this namespace, so that sockets it makes belong here
        (a socket keeps its namespace for life, whichever thread uses it later)."""
        results: list[T] = []
        errors: list[BaseException] = []

        def entered() -> None:
            try:
                _enter(self.name)
                results.append(function())
            except BaseException as exc:
                errors.append(exc)

        # The thread ends right after, taking its changed namespace with it.
        thread = threading.Thread(target=entered, name=f"in {self.name}")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return results[0]

    def socket(self, family: int = AF_INET, kind: int = SOCK_STREAM) -> Socket:
        """A socket in this namespace, for use from the test's own process."""
        return self.call(lambda: Socket(family, kind))

    def pids(self) -> list[int]:
        """Every process running in this namespace."""
        return pids_in(self.name)

    def close(self) -> None:
        """Stop the processes started here (SIGTERM, then SIGKILL), kill any other process left in the
        namespace, and delete it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
        # Programs started some other way (a site's daemon, a child of a child) go down hard: a namespace
        # deleted while a process still runs in it lives on, unnamed, with its interfaces.
        _kill_all(self.name)
        done = run_command(["ip", "netns", "del", self.name], check=False)
        if done.returncode != 0 and self.name in list_namespaces():
            raise NetBedError(f"ip netns del {self.name}: {done.stderr.strip()}")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _enter(netns: str) -> None:
    """Move the calling thread into ``netns`` (setns(2); Python 3.11's os has no setns)."""
    descriptor = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        if _libc().setns(descriptor, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise NetBedError(f"setns into {netns}: {os.strerror(error)}")
    finally:
        os.close(descriptor)
