"""The "now" view of hand-made requests: the slowest destinations and commands of the last five minutes,
the destinations with errors, and what has waited for an answer too long."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from spark.anomaly_rules import AnomalyRules
from spark.now_view import now_view
from spark.timeline import request_timeline
from tests.spark.frames import T0, event, events_frame, round_trip
from wire import event_schema as ev

S = 1_000_000
NEWEST = T0 + 400 * S


def answered_in(at: int, uid: str, dst: int, cmd: str, extra_ms: int) -> list[dict[str, Any]]:
    """A round trip of 5.4 ms plus ``extra_ms`` in the destination's service."""
    return [
        e if e[ev.TS] < at + 4000 else {**e, ev.TS: e[ev.TS] + extra_ms * 1000}
        for e in round_trip(at, uid=uid, dst=dst, cmd=cmd)
    ]


def ended(at: int, uid: str, dst: int, outcome: str) -> list[dict[str, Any]]:
    key = {ev.UID: uid, ev.CMD: "calc.add", ev.SRC: 1, ev.DST: dst, ev.HOST: "h1"}
    return [event(at, 1, ev.ACCEPTED, **key), event(at + 100, 1, outcome, **key)]


def accepted(at: int, uid: str, dst: int) -> list[dict[str, Any]]:
    return [event(at, 1, ev.ACCEPTED, uid=uid, cmd="calc.add", src=1, dst=dst, host="h1")]


def test_the_view_ranks_the_last_minutes_destinations_and_commands_and_lists_errors_and_the_unanswered(
    spark: SparkSession,
) -> None:
    recent = NEWEST - 60 * S
    rows = [
        *answered_in(recent, "2.1", 2, "calc.add", 5),
        *answered_in(recent + S, "2.2", 2, "calc.add", 15),
        *answered_in(recent + 2 * S, "2.3", 2, "calc.add", 25),
        *answered_in(recent + 3 * S, "2.4", 2, "calc.mul", 95),
        *answered_in(recent + 4 * S, "3.1", 3, "calc.add", 45),
        *ended(recent + 5 * S, "3.2", 3, ev.FAILED),
        *ended(recent + 6 * S, "3.3", 3, ev.EXPIRED),
        # Answered before the window: not in the view.
        *answered_in(NEWEST - 400 * S, "5.1", 5, "calc.add", 900),
        # Waiting for 30 s, and for 5 s (not yet counted as unanswered).
        *accepted(NEWEST - 30 * S, "4.1", 4),
        *accepted(NEWEST - 5 * S, "4.2", 4),
    ]
    requests = request_timeline(events_frame(spark, rows))
    view = now_view(requests, NEWEST, AnomalyRules(), {"batch": 7})

    assert [(row["dst"], row["samples"], row["p99_ms"]) for row in view["slowest_destinations"]] == [
        (2, 4, 100.4),
        (3, 1, 50.4),
    ]
    assert [(row["dst"], row["cmd"], row["p50_ms"]) for row in view["slowest_commands"]] == [
        (2, "calc.mul", 100.4),
        (3, "calc.add", 50.4),
        (2, "calc.add", 20.4),
    ]
    columns = {"dst", "cmd", "samples", "p50_ms", "p90_ms", "p99_ms", "max_ms"}
    assert set(view["slowest_commands"][0]) == columns
    assert view["errors"] == [{"dst": 3, "requests": 3, "failed": 1, "expired": 1, "error_share": 0.667}]
    assert view["unanswered_count"] == 1
    assert [(row["dst"], row["uid"], row["waiting_s"]) for row in view["unanswered"]] == [(4, "4.1", 30.0)]
    assert view["anomalies"] == [] and view["progress"] == {"batch": 7}
