from __future__ import annotations

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.timeline import HOPS, NO_OUTCOME, request_timeline
from tests.spark.frames import T0, event, events_frame, round_trip
from wire import event_schema as ev

KEY = {ev.CMD: "calc.add", ev.SRC: 1, ev.DST: 2, ev.HOST: "h1"}


def test_round_trip_on_one_host_gives_every_hop(spark: SparkSession) -> None:
    rows = request_timeline(events_frame(spark, round_trip()))
    actual = rows.select(
        ev.SRC, ev.UID, ev.DST, "same_host", "outcome", "furthest_step", "end_to_end_us", *HOPS
    )
    expected = Row(
        src=1,
        uid="2.7",
        dst=2,
        same_host=True,
        outcome=ev.DELIVERED,
        furthest_step=ev.DELIVERED,
        end_to_end_us=5400,
        sender_queue_us=1200,
        send_us=900,
        remote_us=2500,
        reply_path_us=1300,
    )
    assertDataFrameEqual(actual, [expected])


def test_reply_path_across_hosts_is_not_computed_and_flagged(spark: SparkSession) -> None:
    rows = request_timeline(events_frame(spark, round_trip(dst_host="h2")))
    actual = rows.select("src_host", "dst_host", "same_host", "remote_us", "reply_path_us", "end_to_end_us")
    expected = Row(
        src_host="h1", dst_host="h2", same_host=False, remote_us=2500, reply_path_us=None, end_to_end_us=5400
    )
    assertDataFrameEqual(actual, [expected])


def test_requests_are_told_apart_by_source_and_uid(spark: SparkSession) -> None:
    # Twins 1 and 3 both send their 7th request to twin 2: same uid, two requests.
    events = events_frame(spark, round_trip(src=1) + round_trip(src=3, t0=T0 + 10_000))
    actual = request_timeline(events).select(ev.SRC, ev.UID, "end_to_end_us")
    assertDataFrameEqual(
        actual, [Row(src=1, uid="2.7", end_to_end_us=5400), Row(src=3, uid="2.7", end_to_end_us=5400)]
    )


def test_failed_expired_and_unanswered_requests(spark: SparkSession) -> None:
    failed = [event(T0, 1, ev.ACCEPTED, uid="2.1", **KEY)]
    for attempt in (1, 2, 3):
        failed.append(
            event(T0 + attempt, 1, ev.SEND_FAILED, uid="2.1", attempt=attempt, error="refused", **KEY)
        )
    failed += [
        event(T0 + 4, 1, ev.RETRY_SCHEDULED, uid="2.1", attempt=n, delay_ms=5000, **KEY) for n in (1, 2)
    ]
    failed.append(event(T0 + 9, 1, ev.FAILED, uid="2.1", error="all retries done: refused", **KEY))
    expired = [
        event(T0, 1, ev.ACCEPTED, uid="2.2", **KEY),
        event(T0 + 60_000_000, 1, ev.EXPIRED, uid="2.2", **KEY),
    ]
    # The destination's lines come first and its clock is behind: the furthest step is still the service.
    unanswered = [
        event(T0 - 5, 2, ev.HANDED_TO_SERVICE, uid="2.3", **KEY),
        event(T0 - 6, 2, ev.RECEIVED, uid="2.3", **KEY),
        event(T0, 1, ev.ACCEPTED, uid="2.3", **KEY),
        event(T0 + 3, 1, ev.SENT, uid="2.3", attempt=1, status=200, duration_us=2, **KEY),
    ]
    rejected = [event(T0, 2, ev.REJECTED, status=401, error="bad signature")]
    rows = request_timeline(events_frame(spark, failed + expired + unanswered + rejected))
    actual = rows.select(
        ev.UID, "outcome", "furthest_step", "attempts", "send_failures", "retries", "end_to_end_us"
    )
    expected = [
        Row(uid="2.1", outcome=ev.FAILED, furthest_step=ev.FAILED, attempts=3, send_failures=3, retries=2),
        Row(
            uid="2.2", outcome=ev.EXPIRED, furthest_step=ev.EXPIRED, attempts=None, send_failures=0, retries=0
        ),
        Row(
            uid="2.3",
            outcome=NO_OUTCOME,
            furthest_step=ev.HANDED_TO_SERVICE,
            attempts=1,
            send_failures=0,
            retries=0,
        ),
    ]
    assertDataFrameEqual(actual, [Row(**row.asDict(), end_to_end_us=None) for row in expected])
