from __future__ import annotations

from datetime import datetime

from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.failures import delivery_by_destination, error_cause, error_causes, unanswered_requests
from spark.timeline import NO_OUTCOME, request_timeline
from tests.spark.frames import T0, event, events_frame, round_trip
from wire import event_schema as ev

KEY = {ev.CMD: "calc.add", ev.SRC: 1, ev.DST: 2, ev.HOST: "h1"}


def test_cause_is_the_error_without_its_prefix_or_the_status(spark: SparkSession) -> None:
    rows = [
        event(T0, 1, ev.FAILED, error="all retries done: connection refused"),
        event(T0, 1, ev.SEND_FAILED, status=503),
        event(T0, 1, ev.SEND_FAILED, error="  timed out  "),
        event(T0, 1, ev.SEND_FAILED),
    ]
    causes = events_frame(spark, rows).select(error_cause().alias("cause"))
    expected = ["connection refused", "HTTP 503", "timed out", "unknown"]
    assertDataFrameEqual(causes, [Row(cause=cause) for cause in expected])


def test_errors_by_destination_and_cause_with_rate_per_request(spark: SparkSession) -> None:
    rows = [event(T0 + n, 1, ev.ACCEPTED, uid=f"2.{n}", **KEY) for n in range(4)]
    rows += [
        event(T0 + 10 + n, 1, ev.SEND_FAILED, uid="2.0", attempt=n, error="connection refused", **KEY)
        for n in (1, 2)
    ]
    rows.append(event(T0 + 20, 1, ev.FAILED, uid="2.0", error="all retries done: connection refused", **KEY))
    rows.append(event(T0 + 30, 3, ev.REJECTED, host="h2", status=401, error="bad signature"))
    expected = [
        Row(dst=2, event=ev.SEND_FAILED, cause="connection refused", events=2, requests=4, per_request=0.5),
        Row(dst=2, event=ev.FAILED, cause="connection refused", events=1, requests=4, per_request=0.25),
        Row(dst=3, event=ev.REJECTED, cause="bad signature", events=1, requests=0, per_request=None),
    ]
    assertDataFrameEqual(error_causes(events_frame(spark, rows)), expected)


def _four_outcomes() -> list[dict[str, object]]:
    delivered = round_trip(uid="2.1")
    failed = [event(T0, 1, ev.ACCEPTED, uid="2.2", **KEY)]
    failed += [
        event(T0 + n, 1, ev.SEND_FAILED, uid="2.2", attempt=n, error="refused", **KEY) for n in (1, 2, 3)
    ]
    failed += [event(T0 + 5, 1, ev.RETRY_SCHEDULED, uid="2.2", attempt=n, **KEY) for n in (1, 2)]
    failed.append(event(T0 + 9, 1, ev.FAILED, uid="2.2", error="all retries done: refused", **KEY))
    expired = [
        event(T0, 1, ev.ACCEPTED, uid="2.3", **KEY),
        event(T0 + 60_000_000, 1, ev.EXPIRED, uid="2.3", **KEY),
    ]
    unanswered = [event(T0 + 1_000_000, 1, ev.ACCEPTED, uid="2.4", **KEY)]
    return delivered + failed + expired + unanswered


def test_delivery_rates_per_destination(spark: SparkSession) -> None:
    delivery = delivery_by_destination(request_timeline(events_frame(spark, _four_outcomes())))
    counts = Row(
        src=1, dst=2, requests=4, delivered=1, failed=1, expired=1, unanswered=1, retried=1, retries=2
    )
    rates = {f"{name}_rate": 0.25 for name in ("delivered", "failed", "expired", "unanswered", "retried")}
    expected = Row(**counts.asDict(), send_failures=3, duplicates=0, mean_attempts=2.0, **rates)
    assertDataFrameEqual(delivery, [expected])


def test_unanswered_requests_with_their_age_at_the_end_of_the_log(spark: SparkSession) -> None:
    events = events_frame(spark, _four_outcomes())
    rows = unanswered_requests(request_timeline(events), events).select(
        ev.UID, "outcome", "furthest_step", "accepted_at", "age_at_log_end_s"
    )
    # Site 1's log ends with the expiry, 60 s after T0.
    expected = [
        Row(uid="2.3", outcome=ev.EXPIRED, furthest_step=ev.EXPIRED, accepted_at=T0, age_at_log_end_s=60.0),
        Row(
            uid="2.4",
            outcome=NO_OUTCOME,
            furthest_step=ev.ACCEPTED,
            accepted_at=T0 + 1_000_000,
            age_at_log_end_s=59.0,
        ),
    ]
    local = [
        Row(**(row.asDict() | {"accepted_at": datetime.fromtimestamp(row["accepted_at"] / 1e6)}))
        for row in expected
    ]
    assertDataFrameEqual(rows, local)
