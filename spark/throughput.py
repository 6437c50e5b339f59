"""Events per minute and site, and the same added up over longer periods for the report's chart."""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from wire import event_schema as ev

COUNTED_EVENTS: Final = (ev.ACCEPTED, ev.DELIVERED, ev.FAILED, ev.EXPIRED, ev.RECEIVED, ev.REJECTED)


def throughput_per_minute(events: DataFrame) -> DataFrame:
    """Per (UTC minute, site): how many of each COUNTED_EVENTS it logged, all its events, and the bytes
    of the requests it accepted.
    """
    minute = F.date_trunc("minute", F.timestamp_micros(F.col(ev.TS))).alias("minute")
    counts = [F.count(F.when(F.col(ev.EVENT) == name, True)).alias(name) for name in COUNTED_EVENTS]
    accepted_bytes = F.sum(F.when(F.col(ev.EVENT) == ev.ACCEPTED, F.col(ev.BYTES)))
    return events.groupBy(minute, F.col(ev.SITE)).agg(
        *counts,
        F.count(F.lit(1)).alias("events"),
        F.coalesce(accepted_bytes, F.lit(0)).alias("accepted_bytes"),
    )


# The report's chart has at most this many points, whatever the time span of the logs.
MAX_CHART_POINTS: Final = 1440
CHART_PERIODS_MIN: Final = (1, 2, 5, 10, 15, 30, 60, 120, 360, 720, 1440)
OUTCOMES: Final = ("accepted", "delivered", "failed", "expired")


def chart_period_s(first_us: int | None, last_us: int | None) -> int:
    """The shortest period of CHART_PERIODS_MIN (in seconds) that cuts the span into at most
    MAX_CHART_POINTS points; longer spans get whole days."""
    span_min = (last_us - first_us) / 60e6 if first_us is not None and last_us is not None else 0.0
    for minutes in CHART_PERIODS_MIN:
        if span_min / minutes <= MAX_CHART_POINTS:
            return 60 * minutes
    return 60 * CHART_PERIODS_MIN[-1] * int(span_min // (CHART_PERIODS_MIN[-1] * MAX_CHART_POINTS) + 1)


def outcomes_per_period(per_minute: DataFrame, period_s: int) -> DataFrame:
    """The ``throughput_per_minute`` table added up over all sites per period of ``period_s``: ``period``
    (its start), then the OUTCOMES."""
    start: Column = F.timestamp_seconds(F.floor(F.unix_timestamp("minute") / period_s) * period_s)
    return per_minute.groupBy(start.alias("period")).agg(*(F.sum(name).alias(name) for name in OUTCOMES))
