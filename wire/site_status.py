"""The part of a daemon's ``GET /status`` report that both the daemon and ``msgbus status`` build from one
shape: the last minute's traffic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Traffic:
    """Messages per second to and from other sites, and the round trips of the site's own requests, over
    the last ``window_s`` seconds (shorter just after the daemon started)."""

    window_s: float
    sent_per_s: float
    received_per_s: float
    round_trips: int
    round_trips_per_s: float
    round_trip_p50_s: float | None
    round_trip_p99_s: float | None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, report: Mapping[str, object]) -> Traffic:
        """The traffic of a report; KeyError or TypeError for a report of another shape."""
        return cls(
            window_s=_number(report["window_s"]),
            sent_per_s=_number(report["sent_per_s"]),
            received_per_s=_number(report["received_per_s"]),
            round_trips=int(_number(report["round_trips"])),
            round_trips_per_s=_number(report["round_trips_per_s"]),
            round_trip_p50_s=_optional_number(report.get("round_trip_p50_s")),
            round_trip_p99_s=_optional_number(report.get("round_trip_p99_s")),
        )


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _optional_number(value: object) -> float | None:
    return None if value is None else _number(value)
