"""Backlog snapshots: how old the pending entries are, and the ones older than their deadline (leaks)."""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from wire import event_schema as ev

# Upper bounds of the age buckets, in seconds, with their labels; older entries fall in the last label.
AGE_BUCKETS_S: Final = (
    (1.0, "<1s"),
    (10.0, "1-10s"),
    (60.0, "10-60s"),
    (300.0, "1-5min"),
    (3600.0, "5-60min"),
)
OLDEST_LABEL: Final = ">=1h"
UNKNOWN_LABEL: Final = "unknown"


def _bucket() -> tuple[Column, Column]:
    age = F.col(ev.AGE_S)
    index: Column = F.when(age.isNull(), F.lit(len(AGE_BUCKETS_S) + 1))
    label: Column = F.when(age.isNull(), F.lit(UNKNOWN_LABEL))
    for position, (upper_s, name) in enumerate(AGE_BUCKETS_S):
        index = index.when(age < upper_s, F.lit(position))
        label = label.when(age < upper_s, F.lit(name))
    return index.otherwise(F.lit(len(AGE_BUCKETS_S))), label.otherwise(F.lit(OLDEST_LABEL))


def backlog_age_histogram(backlog: DataFrame) -> DataFrame:
    """Per (snapshot time, site, kind, age bucket): entries. ``bucket`` orders the ``age_range`` labels."""
    index, label = _bucket()
    return backlog.groupBy(
        F.timestamp_micros(F.col(ev.TAKEN_AT)).alias(ev.TAKEN_AT),
        F.col(ev.SITE),
        F.col(ev.KIND),
        index.alias("bucket"),
        label.alias("age_range"),
    ).agg(F.count(F.lit(1)).alias("entries"))


def backlog_leaks(backlog: DataFrame) -> DataFrame:
    """Entries still pending after their deadline, with ``overdue_s`` (how long past it the snapshot was)."""
    leaked = backlog.where(F.col(ev.DEADLINE).isNotNull() & (F.col(ev.DEADLINE) < F.col(ev.TAKEN_AT)))
    return leaked.select(
        *(F.col(name) for name in ev.BACKLOG_FIELDS),
        ((F.col(ev.TAKEN_AT) - F.col(ev.DEADLINE)) / 1_000_000.0).alias("overdue_s"),
    )
