"""The anomaly rules on hand-made requests: a destination that starts failing is one, a destination that
always failed as often is not, and a slow stretch is judged against the usual p99, not against itself."""

from __future__ import annotations

import calendar
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from spark.anomalies import FAILING, SLOWER, judge, judge_minutes
from spark.anomaly_rules import AnomalyRules
from spark.timeline import request_timeline
from tests.spark.frames import T0, event, events_frame, round_trip
from wire import event_schema as ev

MINUTE = 60_000_000
START = T0 - T0 % MINUTE
RULES = AnomalyRules(recent_minutes=2, baseline_minutes=10, min_recent=5, min_baseline=20)


def failed(at: int, uid: str, dst: int) -> list[dict[str, Any]]:
    key = {ev.UID: uid, ev.CMD: "calc.add", ev.SRC: 1, ev.DST: dst, ev.HOST: "h1"}
    return [
        event(at, 1, ev.ACCEPTED, **key),
        event(at + 100, 1, ev.FAILED, error="all retries done: x", **key),
    ]


def minutes_of_traffic(end_min: int, failing_from: int, slow_from: int) -> list[dict[str, Any]]:
    """Per minute: to twin 2, 6 answered and (from ``failing_from``) 6 failed; to twin 3, 5 answered and 1
    failed throughout; to twin 4, 6 answered, 200 ms slower from ``slow_from``."""
    events: list[dict[str, Any]] = []
    for minute in range(end_min):
        base = START + minute * MINUTE
        for n in range(6):
            events += round_trip(base + n * 1000, uid=f"2.{minute}.{n}", dst=2)
            if minute >= failing_from:
                events += failed(base + 500_000 + n * 1000, f"2.{minute}.f{n}", 2)
            if n < 5:
                events += round_trip(base + n * 1000, uid=f"3.{minute}.{n}", dst=3)
            else:
                events += failed(base + n * 1000, f"3.{minute}.f", 3)
            slow = 200_000 if minute >= slow_from else 0
            trip = round_trip(base + n * 1000, uid=f"4.{minute}.{n}", dst=4)
            events += [e if e[ev.EVENT] != ev.DELIVERED else {**e, ev.TS: e[ev.TS] + slow} for e in trip]
    return events


def test_a_destination_that_starts_failing_or_turns_slow_is_an_anomaly_one_always_so_is_not(
    spark: SparkSession,
) -> None:
    requests = request_timeline(events_frame(spark, minutes_of_traffic(14, failing_from=12, slow_from=12)))
    found = {(row["kind"], row[ev.DST]) for row in judge(requests, START + 14 * MINUTE, RULES).collect()}
    assert found == {(FAILING, 2), (SLOWER, 4)}
    # Minute by minute: nothing before the change, both from the minute it began.
    by_minute = judge_minutes(requests, START + 11 * MINUTE, START + 14 * MINUTE, RULES).collect()
    assert sorted((minute_index(row["minute"]), row["kind"]) for row in by_minute) == sorted(
        (minute, kind) for minute in (12, 13) for kind in (FAILING, SLOWER)
    )


def minute_index(moment: datetime) -> int:
    """Which minute of the traffic a (UTC) timestamp of the tables is."""
    return (calendar.timegm(moment.timetuple()) * 1_000_000 - START) // MINUTE
