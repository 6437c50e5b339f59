"""The part of a daemon's ``GET /status`` report that both the daemon and ``msgbus status`` build from one
shape, the last minute's traffic, and the checks of the numbers ``msgbus status`` reads from the report."""

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
            window_s=number(report["window_s"]),
            sent_per_s=number(report["sent_per_s"]),
            received_per_s=number(report["received_per_s"]),
            round_trips=int(number(report["round_trips"])),
            round_trips_per_s=number(report["round_trips_per_s"]),
            round_trip_p50_s=optional_number(report.get("round_trip_p50_s")),
            round_trip_p99_s=optional_number(report.get("round_trip_p99_s")),
        )


def number(value: object) -> float:
    """``value`` if it is a JSON number (not a boolean); TypeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def optional_number(value: object) -> float | None:
    """:func:`number`, or None for a JSON null."""
    return None if value is None else number(value)
