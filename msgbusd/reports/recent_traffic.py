"""The last minute of a site's traffic: messages per second each way, and the round trips' percentiles.

Counting is on the hot path, so it is O(1) per call and touches nothing but memory: counts go into one slot
per second of a ring, and round trips into a bounded deque. Rates and percentiles are worked out only when
someone asks (``/status``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from wire.site_status import Traffic

WINDOW_S = 60
# Round trips kept for the percentiles: beyond this many a minute, they are those of the newest.
MAX_SAMPLES = 20_000


class RateWindow:
    """Events counted per second over the last ``window_s`` seconds."""

    def __init__(self, window_s: int = WINDOW_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._started = clock()
        self._counts = [0] * window_s
        # The second each slot counts; a slot of an older second is reset when it is used again.
        self._seconds = [-1] * window_s

    def add(self, count: int = 1) -> None:
        second = int(self._clock())
        slot = second % self.window_s
        if self._seconds[slot] != second:
            self._seconds[slot] = second
            self._counts[slot] = 0
        self._counts[slot] += count

    def total(self) -> int:
        """Events in the last ``window_s`` seconds (the current second included)."""
        now = int(self._clock())
        return sum(
            count
            for second, count in zip(self._seconds, self._counts, strict=True)
            if 0 <= now - second < self.window_s
        )

    def per_second(self) -> float:
        """The mean rate over the window, or over the time since counting began if that is shorter."""
        return self.total() / self.covered_s()

    def covered_s(self) -> float:
        return min(float(self.window_s), max(1.0, self._clock() - self._started))


class LatencyWindow:
    """Durations observed over the last ``window_s`` seconds: how many, and their percentiles."""

    def __init__(
        self,
        window_s: int = WINDOW_S,
        *,
        max_samples: int = MAX_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.count = RateWindow(window_s, clock=clock)
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, seconds: float) -> None:
        self._samples.append((self._clock(), seconds))
        self.count.add()

    def percentiles(self, *ranks: float) -> list[float | None]:
        """The nearest-rank percentile of each of ``ranks`` (0 < rank <= 100), None when there was nothing."""
        oldest = self._clock() - self._window_s
        while self._samples and self._samples[0][0] < oldest:
            self._samples.popleft()
        values = sorted(seconds for _, seconds in self._samples)
        if not values:
            return [None] * len(ranks)
        return [values[max(0, math.ceil(rank / 100 * len(values)) - 1)] for rank in ranks]


class RecentTraffic:
    """What went through a site in the last minute: messages sent to other sites (requests and replies),
    messages received from them, and the round trips of local requests (acceptance to delivery)."""

    def __init__(self, window_s: int = WINDOW_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.sent = RateWindow(window_s, clock=clock)
        self.received = RateWindow(window_s, clock=clock)
        self.round_trips = LatencyWindow(window_s, clock=clock)

    def snapshot(self) -> Traffic:
        p50, p99 = self.round_trips.percentiles(50, 99)
        count = self.round_trips.count
        return Traffic(
            window_s=round(count.covered_s(), 3),
            sent_per_s=round(self.sent.per_second(), 3),
            received_per_s=round(self.received.per_second(), 3),
            round_trips=count.total(),
            round_trips_per_s=round(count.per_second(), 3),
            round_trip_p50_s=_microseconds(p50),
            round_trip_p99_s=_microseconds(p99),
        )


def _microseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)
