"""How many links a site lets begin at a time: a herd of edges coming back at once (the site restarted, a
network came back) is let in at a bounded rate, each in its turn, and nobody is turned away for good.

Every link begins with a TCP connection, an HTTP upgrade and a handshake that checks two signatures and makes
two: about 0.6 ms of the site's CPU, 0.3 of it for the connection and its upgrade alone. Ten thousand edges
dialing within a second would take the site's whole core for six, during which it answers nothing else on
time. So the upgrades to ``/zbus-link`` begin at ``rate_per_s`` at most (``burst`` at once after a quiet
while), each at a turn of its own:

- an upgrade whose turn is at most ``max_wait_s`` away waits for it, unanswered, on its connection (it costs
  the site a connection, not another one later);
- one whose turn is further is answered ``503`` with ``Retry-After``: when to dial again. Each one so turned
  away is given a time one turn after the last one's, so that they come back spread at the rate the site
  takes them rather than together again. ``Retry-After`` counts whole seconds; the dialer adds up to one of
  its own (:func:`come_back_in_s`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

# The upgrade's answer to a dialer turned away, and its header.
BUSY_STATUS = 503
RETRY_AFTER = "Retry-After"
# An upgrade waits at most this long for its turn (below the 10 s a site gives a link to open by default).
MAX_WAIT_S = 4.0
# After a quiet while, this long's worth of links begin at once: their hellos come back together, and each
# costs the site a quarter of a millisecond of checking and signing in the same turn of its event loop.
BURST_S = 0.05


@dataclass(frozen=True)
class Turn:
    """When a link may begin: after ``wait_s`` (0: now), or, ``wait_s`` None, not now: its dialer is to
    dial again in ``retry_after_s``."""

    wait_s: float | None
    retry_after_s: float = 0.0


class LinkAdmission:
    """Lets links begin at ``rate_per_s`` at most, ``burst`` at once, each at its turn."""

    def __init__(
        self,
        rate_per_s: float,
        burst: float | None = None,
        max_wait_s: float = MAX_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        on_turned_away: Callable[[], None] | None = None,
    ) -> None:
        if rate_per_s <= 0:
            raise ValueError("the rate of new links must be positive")
        self.rate_per_s = rate_per_s
        self.burst = burst if burst is not None else max(1.0, rate_per_s * BURST_S)
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._on_turned_away = on_turned_away
        # The next turn free (monotonic); after a quiet while, a burst of turns up to now is free.
        self._next_turn = -math.inf
        # When the dialer turned away last was told to come back.
        self._told_until = 0.0
        # Upgrades that waited for their turn, and dialers turned away, in all.
        self.waited = 0
        self.turned_away = 0

    def admit(self) -> Turn:
        """The turn of an upgrade that comes now."""
        now = self._clock()
        turn = max(self._next_turn, now - (self.burst - 1) / self.rate_per_s)
        wait_s = turn - now
        if wait_s <= self.max_wait_s:
            self._next_turn = turn + 1 / self.rate_per_s
            if wait_s > 0:
                self.waited += 1
            return Turn(max(0.0, wait_s))
        # Not booked: it comes back after those told before it, by when the turns are taken about as fast.
        self._told_until = max(self._told_until, turn) + 1 / self.rate_per_s
        self.turned_away += 1
        if self._on_turned_away is not None:
            self._on_turned_away()
        return Turn(None, self._told_until - now)


def retry_after_header(delay_s: float) -> str:
    """``Retry-After`` for a turn ``delay_s`` away: whole seconds, rounded down (the dialer adds up to
    one)."""
    return str(max(0, math.floor(delay_s)))


def come_back_in_s(retry_after: str | None, rng: random.Random | None = None) -> float | None:
    """How long a dialer turned away waits: the site's ``Retry-After`` (whole seconds) and up to one more
    second of its own; None when the site said none (or something unreadable)."""
    if retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds + (rng or random).random()
