"""When a destination is an anomaly (spark.anomalies): without PySpark, so that the CLI can offer them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MINUTE_US: Final = 60_000_000


@dataclass(frozen=True)
class AnomalyRules:
    recent_minutes: int = 3
    baseline_minutes: int = 60
    # A (dst, cmd) is SLOWER when its recent p99 is at least this many times its baseline p99 ...
    latency_factor: float = 3.0
    # ... and a destination FAILING when its recent share of failed or expired requests is at least
    # error_share and at least error_factor times its baseline share.
    error_share: float = 0.1
    error_factor: float = 3.0
    # Requests with an outcome needed on each side for a judgement.
    min_recent: int = 30
    min_baseline: int = 50

    @property
    def span_us(self) -> int:
        """The recent and the baseline minutes together."""
        return (self.recent_minutes + self.baseline_minutes) * MINUTE_US

    def baseline_start_us(self, end_us: int) -> int:
        return end_us - self.span_us
