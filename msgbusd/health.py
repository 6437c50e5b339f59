"""Per-destination health: a circuit that opens when a twin's site stops answering, and probes it.

Only failures that say "the site is not there" count (no connection, a timeout, a cut connection); a site
that answers with an error is alive. While the circuit is open, senders do not spend network time on that
twin: they either fail fast or hold the message (``--hold-offline``). After a backoff one attempt is let
through as a probe; its success closes the circuit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from msgbusd.backoff import Backoff


@dataclass
class _Peer:
    failures: int = 0
    open_until: float = 0.0
    last_cause: str = ""


class PeerHealth:
    def __init__(
        self,
        backoff: Backoff,
        *,
        failures_to_open: int = 3,
        probe_timeout_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backoff = backoff
        self._failures_to_open = failures_to_open
        self._probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._peers: dict[int, _Peer] = {}

    def open_count(self) -> int:
        """How many peers have an open circuit."""
        return sum(1 for peer in self._peers.values() if peer.failures >= self._failures_to_open)

    def may_send(self, twin: int) -> bool:
        """True if an attempt may go to ``twin`` now. In an open circuit this reserves the one probe."""
        peer = self._peers.get(twin)
        if peer is None or peer.failures < self._failures_to_open:
            return True
        now = self._clock()
        if now < peer.open_until:
            return False
        peer.open_until = now + self._probe_timeout_s
        return True

    def seconds_until_probe(self, twin: int) -> float:
        peer = self._peers.get(twin)
        if peer is None:
            return 0.0
        return max(0.0, peer.open_until - self._clock())

    def last_cause(self, twin: int) -> str:
        peer = self._peers.get(twin)
        return peer.last_cause if peer else ""

    def succeeded(self, twin: int) -> None:
        self._peers.pop(twin, None)

    def unreachable(self, twin: int, cause: str) -> None:
        """Record that ``twin``'s site did not answer."""
        peer = self._peers.setdefault(twin, _Peer())
        peer.failures += 1
        peer.last_cause = cause
        if peer.failures >= self._failures_to_open:
            peer.open_until = self._clock() + self._backoff.delay_s(
                peer.failures - self._failures_to_open + 1
            )
