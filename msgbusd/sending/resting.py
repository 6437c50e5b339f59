"""Peers whose sender stopped for want of work, kept a while before they are forgotten.

A sender that has nothing to send ends within seconds: an asyncio task waiting is a few dozen objects (its
coroutines, a timer, the futures it waits on) that Python's cyclic collector walks at every look at its
middle generation for as long as they live, and a cloud sending to thousands of edges now and then had
thousands of them waiting. What is worth keeping is the peer itself (its health, when it was last sent to,
which decides between a POST and a link) and, on a site of several processes, the lease of sending to it:
both stay for :data:`KEPT_S` after the sender stopped, so that a twin sent to every few seconds is not set up
and claimed again each time. Then the peer is forgotten, in the order they came to rest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# A peer that answers is kept this long after its sender stopped.
KEPT_S = 30.0
TIMER_SLACK_S = 0.01


class RestingPeers:
    """The twins whose peer rests (no sender, kept), oldest first; ``forget`` is called with each once it
    has rested ``kept_s``."""

    def __init__(
        self,
        forget: Callable[[int], None],
        kept_s: float = KEPT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._forget = forget
        self._kept_s = kept_s
        self._clock = clock
        self._since: dict[int, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __contains__(self, twin: object) -> bool:
        return twin in self._since

    def __len__(self) -> int:
        return len(self._since)

    def rest(self, twin: int) -> None:
        """``twin``'s sender stopped: its peer rests from now."""
        self._since.pop(twin, None)
        self._since[twin] = self._clock()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._kept_s, self._forget_due)

    def woke(self, twin: int) -> None:
        """``twin`` has a sender again (or is gone otherwise): it no longer rests."""
        self._since.pop(twin, None)

    def _forget_due(self) -> None:
        self._timer = None
        now = self._clock()
        while self._since:
            twin, since = next(iter(self._since.items()))
            # (A timer may run a little early by the clock read here.)
            if since + self._kept_s > now + TIMER_SLACK_S:
                self._timer = asyncio.get_running_loop().call_later(
                    since + self._kept_s - now, self._forget_due
                )
                return
            del self._since[twin]
            self._forget(twin)
