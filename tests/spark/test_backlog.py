from __future__ import annotations

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.backlog import backlog_age_histogram, backlog_leaks
from tests.spark.frames import T0, backlog_frame
from wire import event_schema as ev


def _entry(uid: str, kind: str, age_s: float | None, deadline: int | None = None) -> dict[str, object]:
    return {ev.TAKEN_AT: T0, ev.SITE: 1, ev.KIND: kind, ev.UID: uid, ev.AGE_S: age_s, ev.DEADLINE: deadline}


def test_ages_fall_in_their_buckets(spark: SparkSession) -> None:
    entries = [_entry("a", "request", 0.5), _entry("b", "request", 5.0), _entry("c", "request", 9.9)]
    entries += [_entry("d", "retry", 100.0), _entry("e", "queued", None), _entry("f", "dead_letter", 4000.0)]
    histogram = backlog_age_histogram(backlog_frame(spark, entries)).select(
        ev.KIND, "bucket", "age_range", "entries"
    )
    expected = [
        Row(kind="request", bucket=0, age_range="<1s", entries=1),
        Row(kind="request", bucket=1, age_range="1-10s", entries=2),
        Row(kind="retry", bucket=3, age_range="1-5min", entries=1),
        Row(kind="queued", bucket=6, age_range="unknown", entries=1),
        Row(kind="dead_letter", bucket=5, age_range=">=1h", entries=1),
    ]
    assertDataFrameEqual(histogram, expected)


def test_leaks_are_entries_past_their_deadline(spark: SparkSession) -> None:
    entries = [
        _entry("late", "request", 90.0, deadline=T0 - 30_000_000),
        _entry("due-now", "request", 60.0, deadline=T0),
        _entry("fine", "retry", 10.0, deadline=T0 + 50_000_000),
        _entry("no-deadline", "queued", 4000.0),
    ]
    leaks = backlog_leaks(backlog_frame(spark, entries))
    assert leaks.columns == [*ev.BACKLOG_FIELDS, "overdue_s"]
    assertDataFrameEqual(leaks.select(ev.UID, "overdue_s"), [Row(uid="late", overdue_s=30.0)])
