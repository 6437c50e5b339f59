from __future__ import annotations

from datetime import datetime

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.throughput import MAX_CHART_POINTS, chart_period_s, outcomes_per_period, throughput_per_minute
from tests.spark.frames import T0, events_frame, round_trip
from wire import event_schema as ev

MINUTE_US = 60_000_000


def test_events_per_minute_and_site(spark: SparkSession) -> None:
    first_minute = (T0 // MINUTE_US) * MINUTE_US
    events = round_trip(t0=first_minute) + round_trip(uid="2.8", t0=first_minute + MINUTE_US)
    actual = throughput_per_minute(events_frame(spark, events))

    def minute(offset: int, site: int, accepted: int, delivered: int, received: int, all_events: int) -> Row:
        return Row(
            minute=datetime.fromtimestamp((first_minute + offset * MINUTE_US) / 1e6),
            site=site,
            accepted=accepted,
            delivered=delivered,
            failed=0,
            expired=0,
            received=received,
            rejected=0,
            events=all_events,
            accepted_bytes=64 * accepted,
        )

    expected = [
        minute(0, 1, 1, 1, 0, 4),
        minute(0, 2, 0, 0, 1, 4),
        minute(1, 1, 1, 1, 0, 4),
        minute(1, 2, 0, 0, 1, 4),
    ]
    assertDataFrameEqual(actual, expected)
    assert {row[ev.SITE] for row in actual.collect()} == {1, 2}


def test_the_chart_period_keeps_the_points_under_the_limit() -> None:
    day_us = 24 * 60 * MINUTE_US
    assert chart_period_s(None, None) == 60
    assert chart_period_s(0, day_us) == 60  # 1,440 minutes: one point a minute
    assert chart_period_s(0, day_us + MINUTE_US) == 120
    assert chart_period_s(0, 4 * day_us) == 5 * 60
    assert chart_period_s(0, 365 * day_us) == 12 * 3600
    for span_days in (1, 3, 30, 365, 5000):
        assert span_days * day_us / (chart_period_s(0, span_days * day_us) * 1e6) <= MAX_CHART_POINTS


def test_outcomes_are_added_up_over_sites_and_periods(spark: SparkSession) -> None:
    first_minute = (T0 // (5 * MINUTE_US)) * 5 * MINUTE_US
    events = [*round_trip(t0=first_minute), *round_trip(uid="2.8", t0=first_minute + 4 * MINUTE_US)]
    events += round_trip(uid="2.9", t0=first_minute + 5 * MINUTE_US)
    per_minute = throughput_per_minute(events_frame(spark, events))
    actual = outcomes_per_period(per_minute, 5 * 60)
    start = datetime.fromtimestamp(first_minute / 1e6)
    then = datetime.fromtimestamp((first_minute + 5 * MINUTE_US) / 1e6)
    expected = [
        Row(period=start, accepted=2, delivered=2, failed=0, expired=0),
        Row(period=then, accepted=1, delivered=1, failed=0, expired=0),
    ]
    assertDataFrameEqual(actual, expected)
