"""Delays between attempts: exponential from a base, capped, with a little jitter so peers do not align."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    base_s: float
    max_s: float
    # Delays are stretched by a random factor in [1, 1 + jitter]: never shorter than the nominal delay.
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay_s(self, failures: int) -> float:
        """Delay after the ``failures``-th consecutive failure (1 for the first)."""
        if self.base_s <= 0:
            return 0.0
        nominal = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return float(nominal * (1 + self.jitter * self.rng.random()))


# Waiting for Redis to come back: fast at first, then every few seconds.
REDIS_RECONNECT = Backoff(base_s=0.1, max_s=5.0)
