"""Faults as named pieces switched on and off around the step under test (toxiproxy's toxics, made of
iptables rules and tc qdiscs in the bed's namespaces).

Each is off when made; :meth:`Fault.on` and :meth:`Fault.off` are idempotent, ``off`` removes exactly what
``on`` added, and ``with fault:`` holds it on for the block.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from testing.netbed.commands import iptables, run_command

# A queue of about 100 ms in front of a thinned link: what a home router's buffer holds at 1-2 Mbit/s,
# enough to keep the link busy without turning every round trip into seconds.
THIN_QUEUE_MS = 100
# Two full Ethernet frames: tbf cannot send a packet bigger than its bucket, and at 1-2 Mbit/s ten
# milliseconds of rate (the usual choice) is less than one frame.
THIN_MIN_BURST_BYTES = 2 * 1514
THIN_BURST_MS = 10

_numbers = itertools.count(1)


class Fault:
    """A fault that can be switched on and off; subclasses say how with :meth:`_apply` and :meth:`_remove`."""

    def __init__(self, name: str) -> None:
        self.name = f"{name}#{next(_numbers)}"
        self.active = False

    def on(self) -> Self:
        """Switch the fault on (nothing happens if it is on already)."""
        if not self.active:
            self._apply()
            self.active = True
        return self

    def off(self) -> None:
        """Switch the fault off, restoring what was there before (nothing happens if it is off)."""
        if self.active:
            self._remove()
            self.active = False

    def __enter__(self) -> Self:
        return self.on()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.off()

    def __repr__(self) -> str:
        return f"<{self.name} {'on' if self.active else 'off'}>"

    def _apply(self) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError


class Rules(Fault):
    """iptables rules in one namespace, put first in their chains; each carries the fault's name as a
    comment, so two faults with the same match never remove each other's rules."""

    def __init__(self, name: str, netns: str, rules: Sequence[tuple[str, Sequence[str]]]) -> None:
        super().__init__(name)
        self.netns = netns
        self.rules = [(chain, [*spec, "-m", "comment", "--comment", self.name]) for chain, spec in rules]
        self._added: list[tuple[str, list[str]]] = []

    def _apply(self) -> None:
        try:
            for chain, spec in self.rules:
                iptables(self.netns, "-I", chain, "1", *spec)
                self._added.append((chain, spec))
        except BaseException:
            self._remove()
            raise

    def _remove(self) -> None:
        while self._added:
            chain, spec = self._added[-1]
            iptables(self.netns, "-D", chain, *spec)
            self._added.pop()


def _both_ways(match: Sequence[str], port: str) -> list[tuple[str, list[str]]]:
    """``match`` on everything the router passes to and from ``port``, and what it says itself there."""
    return [
        ("FORWARD", ["-i", port, *match]),
        ("FORWARD", ["-o", port, *match]),
        ("INPUT", ["-i", port, *match]),
        ("OUTPUT", ["-o", port, *match]),
    ]


def black_hole(router_netns: str, port: str) -> Rules:
    """Drop every packet through router interface ``port``, both ways, with no answer (a pulled cable)."""
    return Rules(f"black_hole({port})", router_netns, _both_ways(["-j", "DROP"], port))


def reset(router_netns: str, port: str) -> Rules:
    """Answer every TCP packet through ``port`` with a reset, both ways."""
    match = ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]
    return Rules(f"reset({port})", router_netns, _both_ways(match, port))


def loss(router_netns: str, port: str, share: float) -> Rules:
    """Drop ``share`` (0 to 1) of the packets through ``port``, at random, each way."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"loss share must be between 0 and 1, got {share}")
    match = ["-m", "statistic", "--mode", "random", "--probability", f"{share:.6f}", "-j", "DROP"]
    return Rules(f"loss({port},{share:g})", router_netns, _both_ways(match, port))


def freeze(gateway_netns: str) -> Rules:
    """A NAT gateway that forwards nothing, either way, and answers nothing (its mappings stay)."""
    return Rules(f"freeze({gateway_netns})", gateway_netns, [("FORWARD", ["-j", "DROP"])])


class Thin(Fault):
    """A thin link: each of ``devices`` (namespace, interface), one per direction, sends at most ``kbit``
    through a token bucket with a queue of :data:`THIN_QUEUE_MS` in front of it."""

    def __init__(self, name: str, devices: Sequence[tuple[str, str]], kbit: int) -> None:
        super().__init__(name)
        if kbit <= 0:
            raise ValueError(f"kbit must be positive, got {kbit}")
        self.devices = list(devices)
        self.kbit = kbit
        self._shaped: list[tuple[str, str]] = []

    @property
    def burst_bytes(self) -> int:
        return max(THIN_MIN_BURST_BYTES, self.kbit * 1000 // 8 * THIN_BURST_MS // 1000)

    def _apply(self) -> None:
        try:
            for netns, device in self.devices:
                # `add`, not `replace`: a second shaper on the same link fails loudly instead of silently
                # replacing the first, which its off() could then not restore.
                run_command(
                    ["tc", "-n", netns, "qdisc", "add", "dev", device, "root", "tbf",
                     "rate", f"{self.kbit}kbit", "burst", str(self.burst_bytes),
                     "latency", f"{THIN_QUEUE_MS}ms"]
                )  # fmt: skip
                self._shaped.append((netns, device))
        except BaseException:
            self._remove()
            raise

    def _remove(self) -> None:
        while self._shaped:
            netns, device = self._shaped[-1]
            run_command(["tc", "-n", netns, "qdisc", "del", "dev", device, "root"])
            self._shaped.pop()


def thin(router_netns: str, port: str, host_netns: str, host_device: str, kbit: int) -> Thin:
    """Shape the link between the router's ``port`` and the host's ``host_device`` to ``kbit`` each way."""
    return Thin(f"thin({port},{kbit}kbit)", [(router_netns, port), (host_netns, host_device)], kbit)
