from __future__ import annotations

from datetime import datetime

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.latency import (
    end_to_end_latency,
    end_to_end_latency_hourly,
    hop_latency,
    latency_stats,
    slowest_destinations,
)
from spark.timeline import request_timeline
from tests.spark.frames import T0, events_frame, round_trip
from wire import event_schema as ev

HOUR_US = 3_600_000_000


def test_percentiles_of_known_values(spark: SparkSession) -> None:
    values = [("a", ms * 1000) for ms in range(1, 11)] + [("b", 2500), ("b", None)]
    frame = spark.createDataFrame(values, "key string, value_us long")
    expected = [
        Row(key="a", samples=10, p50_ms=5.0, p90_ms=9.0, p99_ms=10.0, max_ms=10.0),
        Row(key="b", samples=1, p50_ms=2.5, p90_ms=2.5, p99_ms=2.5, max_ms=2.5),
    ]
    assertDataFrameEqual(latency_stats(frame, "value_us", ["key"]), expected)


def test_end_to_end_per_route_and_hour(spark: SparkSession) -> None:
    late = T0 + 2 * HOUR_US
    requests = request_timeline(events_frame(spark, round_trip() + round_trip(uid="2.8", t0=late)))
    route = Row(src=1, dst=2, cmd="calc.add")
    stats = {"p50_ms": 5.4, "p90_ms": 5.4, "p99_ms": 5.4, "max_ms": 5.4}
    assertDataFrameEqual(end_to_end_latency(requests), [Row(**route.asDict(), samples=2, **stats)])
    hourly = end_to_end_latency_hourly(requests)
    hours = [datetime.fromtimestamp((t // HOUR_US) * HOUR_US / 1e6) for t in (T0, late)]
    assertDataFrameEqual(hourly, [Row(hour=hour, **route.asDict(), samples=1, **stats) for hour in hours])


def test_hops_count_reply_paths_they_could_not_measure(spark: SparkSession) -> None:
    events = round_trip() + round_trip(uid="2.8", dst_host="h2")
    hops = hop_latency(request_timeline(events_frame(spark, events)))
    route = {ev.SRC: 1, ev.DST: 2, ev.CMD: "calc.add"}

    def hop(name: str, samples: int, ms: float, cross_host: int = 0) -> Row:
        return Row(
            **route,
            hop=name,
            samples=samples,
            p50_ms=ms,
            p90_ms=ms,
            p99_ms=ms,
            max_ms=ms,
            cross_host=cross_host,
        )

    expected = [
        hop("sender_queue", 2, 1.2),
        hop("send", 2, 0.9),
        hop("remote", 2, 2.5),
        hop("reply_path", 1, 1.3, 1),
    ]
    assertDataFrameEqual(hops, expected)


def test_slowest_destination_ranks_first(spark: SparkSession) -> None:
    events = round_trip() + round_trip(uid="3.1", dst=3)
    # Make twin 3's reply arrive 10 ms later than twin 2's.
    slow = [
        row | {ev.TS: row[ev.TS] + 10_000} if row[ev.DST] == 3 and row[ev.TS] - T0 >= 5300 else row
        for row in events
    ]
    ranked = slowest_destinations(request_timeline(events_frame(spark, slow))).select(
        "rank", ev.DST, "p99_ms"
    )
    assertDataFrameEqual(ranked, [Row(rank=1, dst=3, p99_ms=15.4), Row(rank=2, dst=2, p99_ms=5.4)])
