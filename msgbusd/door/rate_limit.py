"""Token buckets per source twin: each twin may send ``rate`` messages per second, in bursts of ``burst``."""

from __future__ import annotations

import time
from collections.abc import Callable

# Buckets of twins not heard from in this long are full again anyway; they are dropped to bound memory.
IDLE_FORGET_S = 300.0


class TokenBuckets:
    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic, max_twins: int = 100_000
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("the rate must be positive and the burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max_twins = max_twins
        self._buckets: dict[int, tuple[float, float]] = {}  # twin -> (tokens, last refill)

    def allow(self, twin: int) -> bool:
        """Take one token from ``twin``'s bucket; False (and nothing taken) when it is empty."""
        now = self._clock()
        tokens, last = self._buckets.get(twin, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= 1
        if allowed:
            tokens -= 1
        if twin not in self._buckets and len(self._buckets) >= self._max_twins:
            self._forget_idle(now)
        self._buckets[twin] = (tokens, now)
        return allowed

    def _forget_idle(self, now: float) -> None:
        for twin in [t for t, (_, last) in self._buckets.items() if now - last > IDLE_FORGET_S]:
            del self._buckets[twin]
        while len(self._buckets) >= self._max_twins:
            del self._buckets[next(iter(self._buckets))]
