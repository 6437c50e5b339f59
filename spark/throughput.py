"""Events per minute and site."""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame
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
