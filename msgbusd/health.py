"""Whether each peer's site can be reached: the peer's state, not each message's.

A send that gets no answer (no connection, a timeout, a cut connection, or 502/503/504) marks the peer down;
a site that answers with another error is up. While a peer is down nothing is sent to it but a cheap probe
every ``probe_s`` to twice that; the first probe or send that gets an answer marks it up again, and its
sender lets everything waiting for it flow at once.

A peer found down is probed at once, then every ``probe_s``, then every ``2 * probe_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from msgbusd.backoff import Backoff


@dataclass
class _Down:
    since: float
    cause: str
    probes: int = 0
    next_probe: float = 0.0
    # False while the peer is only not known yet (the daemon just started).
    seen: bool = True


class PeerHealth:
    def __init__(self, probe_s: float = 1.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        # A failed probe is followed by another after probe_s at first, then 2 * probe_s (plus some jitter).
        self._probes = Backoff(probe_s, 2 * probe_s)
        self._clock = clock
        self._down: dict[int, _Down] = {}

    def down_count(self) -> int:
        """How many peers are down."""
        return len(self._down)

    def is_down(self, twin: int) -> bool:
        return twin in self._down

    def seconds_until_probe(self, twin: int) -> float:
        peer = self._down.get(twin)
        return 0.0 if peer is None else max(0.0, peer.next_probe - self._clock())

    def last_cause(self, twin: int) -> str:
        peer = self._down.get(twin)
        return peer.cause if peer else ""

    def unreachable(self, twin: int, cause: str) -> bool:
        """Record that ``twin``'s site did not answer (a send or a probe); True if it was up until now.

        The first probe goes out at once: a connection cut by something in between, or an answer lost, is
        over by then, and a site that is really down refuses it at no cost."""
        now = self._clock()
        peer = self._down.get(twin)
        if peer is None:
            self._down[twin] = _Down(now, cause, next_probe=now)
            return True
        newly = not peer.seen
        if newly:
            peer.seen, peer.since = True, now
        peer.cause = cause
        peer.probes += 1
        peer.next_probe = now + self._probes.delay_s(peer.probes)
        return newly

    def unknown(self, twin: int) -> None:
        """Nothing is known of ``twin`` yet (the daemon just started with messages for it): probe it before
        sending, so that a peer that is down costs the messages no try."""
        if twin not in self._down:
            now = self._clock()
            self._down[twin] = _Down(now, "not probed yet", next_probe=now, seen=False)

    def busy(self, twin: int, retry_after_s: float) -> None:
        """``twin``'s site answered but cannot take messages for ``retry_after_s`` (its Redis is away)."""
        peer = self._down.get(twin)
        if peer is not None:
            peer.next_probe = self._clock() + retry_after_s

    def answered(self, twin: int) -> float | None:
        """``twin``'s site answered; returns how long it had been seen down, or None if it was not."""
        peer = self._down.pop(twin, None)
        return None if peer is None or not peer.seen else self._clock() - peer.since
