"""The delay fault: every packet crossing the router is held for a while, both ways, handshakes included.

This kernel has no netem, so the router routes what arrives from its host-facing interfaces into a TUN
device, where :mod:`testing.netbed.delay_line` holds each packet and writes it back into the device; what
comes back in through the TUN device is routed the ordinary way, to its destination::

    ip rule  pref 100  iif dly0        lookup main    # packets coming back out of the delay line
    ip rule  pref 101  iif <each port> lookup 100     # packets from the hosts
    ip route default dev dly0 table 100
"""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Sequence

from testing.netbed.commands import sysctl
from testing.netbed.errors import NetBedError
from testing.netbed.faults import Fault
from testing.netbed.namespaces import Namespace

DEVICE = "dly0"
TABLE = "100"
BACK_PREF = "100"
INTO_PREF = "101"
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class Delay(Fault):
    """Hold every packet that enters the router through ``ports`` for ``ms`` milliseconds (a round trip
    between two hosts takes ``2 * ms`` more). Interfaces added to the router after :meth:`on` are not
    delayed. ``ms == 0`` changes nothing."""

    def __init__(self, router: Namespace, ports: Sequence[str], ms: float) -> None:
        super().__init__(f"delay({ms:g}ms)")
        if ms < 0:
            raise ValueError(f"delay must not be negative, got {ms} ms")
        self.router = router
        self.ports = list(ports)
        self.ms = ms
        self.process: subprocess.Popen[bytes] | None = None
        self._rules: list[list[str]] = []

    def _apply(self) -> None:
        if self.ms == 0:
            return
        try:
            self._start_line()
            self.router.ip("link", "set", DEVICE, "up")
            sysctl(self.router.name, f"net.ipv4.conf.{DEVICE}.rp_filter", 0)
            self.router.ip("route", "add", "default", "dev", DEVICE, "table", TABLE)
            # The way back first: until it is there, a packet written back would loop into the line again.
            self._add_rule(["pref", BACK_PREF, "iif", DEVICE, "lookup", "main"])
            for port in self.ports:
                self._add_rule(["pref", INTO_PREF, "iif", port, "lookup", TABLE])
        except BaseException:
            self._remove()
            raise

    def _start_line(self) -> None:
        # stdin stays open as long as this process lives: the delay line exits when it closes.
        self.process = self.router.popen(
            [sys.executable, "-m", "testing.netbed.delay_line", "--device", DEVICE,
             "--delay-ms", str(self.ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.process.stdout], [], [], deadline - time.monotonic())
            if readable:
                line = self.process.stdout.readline()
                if line.strip() == b"ready":
                    return
                if not line:
                    break
        raise NetBedError(f"the delay line in {self.router.name} did not start (exit {self.process.poll()})")

    def _add_rule(self, rule: list[str]) -> None:
        self.router.ip("rule", "add", *rule)
        self._rules.append(rule)

    def _remove(self) -> None:
        while self._rules:
            self.router.ip("rule", "del", *self._rules[-1])
            self._rules.pop()
        if self.process is not None:
            # SIGTERM: it writes out what it still holds, then exits and its TUN device (and the route
            # through it) goes with it.
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
            self.process = None
