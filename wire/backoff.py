"""Delays between attempts: exponential from a base, capped, with a little jitter so peers do not align, or
with full jitter (any delay from zero up to the backoff), where many clients come back to one server."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    base_s: float
    max_s: float
    # Delays are stretched by a random factor in [1, 1 + jitter]: never shorter than the nominal delay.
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    # A delay anywhere from zero up to the nominal one instead ("full jitter", AWS's "Exponential Backoff
    # And Jitter"): thousands of clients that lost one server at once come back spread over the backoff,
    # not in a wave at each of its steps.
    full_jitter: bool = False

    def delay_s(self, failures: int) -> float:
        """Delay after the ``failures``-th consecutive failure (1 for the first)."""
        if self.full_jitter:
            return self.nominal_s(failures) * self.rng.random()
        return self.nominal_s(failures) * (1 + self.jitter * self.rng.random())

    def nominal_s(self, failures: int) -> float:
        """:meth:`delay_s` without the jitter."""
        if self.base_s <= 0:
            return 0.0
        return float(min(self.max_s, self.base_s * 2 ** min(max(0, failures - 1), 64)))

    def total_s(self, first: int, last: int) -> float:
        """The nominal delays after failures ``first`` to ``last`` added up (0 when ``last < first``)."""
        total = 0.0
        for failures in range(max(first, 1), last + 1):
            delay = self.nominal_s(failures)
            if delay >= self.max_s:
                return total + delay * (last - failures + 1)
            total += delay
        return total


# Waiting for Redis to come back: fast at first, then every few seconds.
REDIS_RECONNECT = Backoff(base_s=0.1, max_s=5.0)


async def sleep_unless(stopping: asyncio.Event, delay_s: float) -> None:
    """Wait ``delay_s``, or less if ``stopping`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), delay_s)
