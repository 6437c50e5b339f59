"""Whether a peer's site can be reached: the peer's state, not each message's.

A send that gets no answer (no connection, a timeout, a cut connection or link, or 502/503/504) marks the
peer down; a site that answers with another error is up. While a peer is down nothing is sent to it but a
cheap probe; the first probe or send that gets an answer marks it up again, and everything waiting for it
flows at once.

A peer found down is probed at once, then every ``probe_s``, then every ``2 * probe_s`` (plus some jitter),
and never more often than the site's :class:`ProbePace` allows all its peers together: with many peers down,
each is probed less often, and probing costs a bounded share of a core.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from wire.backoff import Backoff

# up: answering; down: did not answer, probed until it does; probing: not known yet (the daemon just started
# with messages for it), probed before anything is sent.
PeerState = Literal["up", "down", "probing"]


@dataclass
class _Down:
    since: float
    cause: str
    probes: int = 0
    next_probe: float = 0.0
    # False while the peer is only not known yet (the daemon just started).
    seen: bool = True


@dataclass(frozen=True)
class HealthState:
    """A peer's state as an operator sees it."""

    state: PeerState
    down_for_s: float = 0.0
    cause: str = ""
    probes: int = 0
    next_probe_in_s: float = 0.0


def probe_backoff(probe_s: float) -> Backoff:
    """The delays between probes of a peer that stays down."""
    return Backoff(probe_s, 2 * probe_s)


class ProbePace:
    """The probes of all the peers that stay down, at most ``per_s`` a second: each asks for a time, and
    gets the first free one from then on (0: no bound)."""

    def __init__(self, per_s: float) -> None:
        self._gap_s = 1.0 / per_s if per_s > 0 else 0.0
        self._next = -math.inf

    def slot(self, wanted: float) -> float:
        """The time of a probe wanted at ``wanted`` (or later), reserved."""
        at = max(wanted, self._next)
        self._next = at + self._gap_s
        return at


class PeerHealth:
    """One peer's state: up, or down since when and why, and when to probe it next."""

    def __init__(
        self, probes: Backoff, *, pace: ProbePace | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._probes = probes
        self._pace = pace or ProbePace(0)
        self._clock = clock
        self._down: _Down | None = None

    @property
    def is_down(self) -> bool:
        return self._down is not None

    @property
    def cause(self) -> str:
        """Why the peer is down ("" when it is up)."""
        return self._down.cause if self._down else ""

    def state(self) -> HealthState:
        """Up, down or probing, and for a peer that is not up: for how long, why, and the next probe."""
        peer = self._down
        if peer is None:
            return HealthState("up")
        now = self._clock()
        return HealthState(
            "down" if peer.seen else "probing",
            down_for_s=now - peer.since,
            cause=peer.cause,
            probes=peer.probes,
            next_probe_in_s=max(0.0, peer.next_probe - now),
        )

    def seconds_until_probe(self) -> float:
        peer = self._down
        return 0.0 if peer is None else max(0.0, peer.next_probe - self._clock())

    def unreachable(self, cause: str) -> bool:
        """Record that the site did not answer (a send or a probe); True if it was up until now.

        The first probe goes out at once: a connection cut by something in between, or an answer lost, is
        over by then, and a site that is really down refuses it at no cost. The next ones are paced."""
        now = self._clock()
        peer = self._down
        if peer is None:
            self._down = _Down(now, cause, next_probe=now)
            return True
        newly = not peer.seen
        if newly:
            peer.seen, peer.since = True, now
        peer.cause = cause
        peer.probes += 1
        peer.next_probe = self._pace.slot(now + self._probes.delay_s(peer.probes))
        return newly

    def unknown(self) -> None:
        """Nothing is known of the peer yet (the daemon just started with messages for it): probe it before
        sending, so that a peer that is down costs the messages no try."""
        if self._down is None:
            now = self._clock()
            self._down = _Down(now, "not probed yet", next_probe=now, seen=False)

    def busy(self, retry_after_s: float) -> None:
        """The site answered but cannot take messages for ``retry_after_s`` (its Redis is away)."""
        if self._down is not None:
            self._down.next_probe = self._clock() + retry_after_s

    def answered(self) -> float | None:
        """The site answered; returns how long it had been seen down, or None if it was not."""
        peer, self._down = self._down, None
        return None if peer is None or not peer.seen else self._clock() - peer.since
