from __future__ import annotations

from datetime import datetime

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.throughput import throughput_per_minute
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
