"""One row per request, identified by (src, uid) across both sites' logs, with the time of each step and the
duration of each hop.

Hops (all in microseconds):
  sender_queue_us  accepted -> first sent, both at the source site
  send_us          duration_us of the sent event (the POST that was answered 2xx)
  remote_us        received -> reply_taken, both at the destination site (its queue and the service)
  reply_path_us    reply_taken (destination) -> reply_received (source): two sites' clocks, so only computed
                   when both sites run on the same host (``same_host``); null otherwise
  end_to_end_us    accepted -> delivered at the source site
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from wire import event_schema as ev

# The steps of a request's life in the order they happen, whatever the clocks say: the furthest one a
# request reached tells where an unanswered request stopped.
STEP_ORDER: Final = (
    ev.ACCEPTED,
    ev.SEND_FAILED,
    ev.RETRY_SCHEDULED,
    ev.SENT,
    ev.RECEIVED,
    ev.DUPLICATE,
    ev.HANDED_TO_SERVICE,
    ev.REPLY_TAKEN,
    ev.REPLY_FAILED,
    ev.REPLY_SENT,
    ev.REPLY_RECEIVED,
    ev.DELIVERED,
    ev.EXPIRED,
    ev.FAILED,
)
HOPS: Final = ("sender_queue_us", "send_us", "remote_us", "reply_path_us")

# outcome values; NO_OUTCOME: accepted, and neither delivered, expired nor failed in the logs read
NO_OUTCOME: Final = "none"


def _is(event: str) -> Column:
    return F.col(ev.EVENT) == event


def _first_ts(event: str, where: Column | None = None) -> Column:
    condition = _is(event) if where is None else _is(event) & where
    return F.min(F.when(condition, F.col(ev.TS)))


def _count(event: str) -> Column:
    return F.count(F.when(_is(event), True))


def _steps() -> Column:
    return F.array(*(F.lit(event) for event in STEP_ORDER))


def _step_rank() -> Column:
    """1 + the event's place in STEP_ORDER (0 for other events), the way ``element_at`` counts."""
    return F.array_position(_steps(), F.col(ev.EVENT))


def request_timeline(events: DataFrame) -> DataFrame:
    """Group ``events`` by (src, uid) into one row per request: step times (``*_ts``), counters and hops."""
    at_src = F.col(ev.SITE) == F.col(ev.SRC)
    at_dst = F.col(ev.SITE) == F.col(ev.DST)
    keyed = events.where(F.col(ev.SRC).isNotNull() & F.col(ev.UID).isNotNull() & ~_is(ev.REJECTED))
    steps = keyed.groupBy(ev.SRC, ev.UID).agg(
        F.max(ev.DST).alias(ev.DST),
        F.max(ev.CMD).alias(ev.CMD),
        F.max(F.when(at_src, F.col(ev.HOST))).alias("src_host"),
        F.max(F.when(at_dst, F.col(ev.HOST))).alias("dst_host"),
        _first_ts(ev.ACCEPTED, at_src).alias("accepted_ts"),
        _first_ts(ev.SENT, at_src).alias("first_sent_ts"),
        F.min(F.when(_is(ev.SENT), F.col(ev.DURATION_US))).alias("send_us"),
        _first_ts(ev.RECEIVED, at_dst).alias("received_ts"),
        _first_ts(ev.REPLY_TAKEN, at_dst).alias("reply_taken_ts"),
        _first_ts(ev.REPLY_RECEIVED, at_src).alias("reply_received_ts"),
        _first_ts(ev.DELIVERED, at_src).alias("delivered_ts"),
        _first_ts(ev.EXPIRED, at_src).alias("expired_ts"),
        _first_ts(ev.FAILED, at_src).alias("failed_ts"),
        F.max(F.when(_is(ev.SENT) | _is(ev.SEND_FAILED), F.col(ev.ATTEMPT))).alias("attempts"),
        _count(ev.SEND_FAILED).alias("send_failures"),
        _count(ev.RETRY_SCHEDULED).alias("retries"),
        _count(ev.DUPLICATE).alias("duplicates"),
        _count(ev.REPLY_FAILED).alias("reply_failures"),
        F.max(_step_rank()).alias("_furthest"),
    )
    same_host = F.col("src_host") == F.col("dst_host")
    outcome = (
        F.when(F.col("delivered_ts").isNotNull(), F.lit(ev.DELIVERED))
        .when(F.col("failed_ts").isNotNull(), F.lit(ev.FAILED))
        .when(F.col("expired_ts").isNotNull(), F.lit(ev.EXPIRED))
        .when(F.col("accepted_ts").isNotNull(), F.lit(NO_OUTCOME))
    )
    return steps.select(
        ev.SRC,
        ev.UID,
        ev.DST,
        ev.CMD,
        "src_host",
        "dst_host",
        same_host.alias("same_host"),
        outcome.alias("outcome"),
        F.element_at(_steps(), F.col("_furthest").cast("int")).alias("furthest_step"),
        "accepted_ts",
        "first_sent_ts",
        "received_ts",
        "reply_taken_ts",
        "reply_received_ts",
        "delivered_ts",
        "expired_ts",
        "failed_ts",
        "attempts",
        "send_failures",
        "retries",
        "duplicates",
        "reply_failures",
        (F.col("first_sent_ts") - F.col("accepted_ts")).alias("sender_queue_us"),
        "send_us",
        (F.col("reply_taken_ts") - F.col("received_ts")).alias("remote_us"),
        F.when(same_host, F.col("reply_received_ts") - F.col("reply_taken_ts")).alias("reply_path_us"),
        (F.col("delivered_ts") - F.col("accepted_ts")).alias("end_to_end_us"),
    )
