"""Error causes, delivery and retry rates per destination, and the requests that got no answer."""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark.timeline import NO_OUTCOME
from wire import event_schema as ev

ERROR_EVENTS: Final = (ev.SEND_FAILED, ev.FAILED, ev.EXPIRED, ev.REJECTED, ev.REPLY_FAILED)
# `failed` repeats the last attempt's error after this prefix; the cause is what follows it.
RETRIES_DONE_PREFIX: Final = "all retries done: "


def error_cause() -> Column:
    """The error text without the retries-done prefix; ``HTTP <status>`` when there is no text."""
    text = F.trim(F.regexp_replace(F.col(ev.ERROR), "^" + RETRIES_DONE_PREFIX, ""))
    return F.coalesce(
        F.when(text != "", text),
        F.when(F.col(ev.STATUS).isNotNull(), F.concat(F.lit("HTTP "), F.col(ev.STATUS).cast("string"))),
        F.lit("unknown"),
    )


def error_destination() -> Column:
    """The destination an error event counts for: a rejected message whose destination could not be read
    counts for the site that rejected it."""
    return F.coalesce(F.col(ev.DST), F.when(F.col(ev.EVENT) == ev.REJECTED, F.col(ev.SITE)))


def accepted_per_destination(events: DataFrame) -> DataFrame:
    """dst, requests: how many requests to each destination were accepted."""
    return (
        events.where(F.col(ev.EVENT) == ev.ACCEPTED).groupBy(ev.DST).agg(F.count(F.lit(1)).alias("requests"))
    )


def error_causes(events: DataFrame) -> DataFrame:
    """Per (dst, event, cause): error events and their rate per request accepted for that destination.

    A rejected message counts for the site that rejected it when its destination could not be read.
    """
    errors = events.where(F.col(ev.EVENT).isin(*ERROR_EVENTS)).select(
        error_destination().alias(ev.DST), F.col(ev.EVENT), error_cause().alias("cause")
    )
    counted = errors.groupBy(ev.DST, ev.EVENT, "cause").agg(F.count(F.lit(1)).alias("events"))
    joined = counted.join(F.broadcast(accepted_per_destination(events)), on=ev.DST, how="left")
    return joined.select(
        ev.DST,
        ev.EVENT,
        "cause",
        "events",
        F.coalesce(F.col("requests"), F.lit(0)).alias("requests"),
        (F.col("events") / F.col("requests")).alias("per_request"),
    )


def _outcomes(outcome: str) -> Column:
    return F.count(F.when(F.col("outcome") == outcome, True))


def delivery_by_destination(requests: DataFrame) -> DataFrame:
    """Per (src, dst): requests accepted, their outcomes, retries, and each as a rate of the requests."""
    accepted = requests.where(F.col("accepted_ts").isNotNull())
    counted = accepted.groupBy(ev.SRC, ev.DST).agg(
        F.count(F.lit(1)).alias("requests"),
        _outcomes(ev.DELIVERED).alias("delivered"),
        _outcomes(ev.FAILED).alias("failed"),
        _outcomes(ev.EXPIRED).alias("expired"),
        _outcomes(NO_OUTCOME).alias("unanswered"),
        F.count(F.when(F.col("retries") > 0, True)).alias("retried"),
        F.sum("retries").alias("retries"),
        F.sum("send_failures").alias("send_failures"),
        F.sum("duplicates").alias("duplicates"),
        F.avg("attempts").alias("mean_attempts"),
    )
    rates = [
        (F.col(name) / F.col("requests")).alias(f"{name}_rate")
        for name in ("delivered", "failed", "expired", "unanswered", "retried")
    ]
    return counted.select(*counted.columns, *rates)


def log_end_per_site(events: DataFrame) -> DataFrame:
    """site, log_end_ts: the last timestamp each site's log holds."""
    return events.groupBy(ev.SITE).agg(F.max(ev.TS).alias("log_end_ts"))


def unanswered_requests(requests: DataFrame, events: DataFrame) -> DataFrame:
    """Accepted requests that expired or have no outcome event, where they stopped, and how long before the
    end of their source site's log they were accepted (a request accepted just before the end may still be
    in flight).
    """
    open_requests = requests.where(F.col("outcome").isin(ev.EXPIRED, NO_OUTCOME))
    ends = F.broadcast(log_end_per_site(events).withColumnRenamed(ev.SITE, ev.SRC))
    joined = open_requests.join(ends, on=ev.SRC, how="left")
    return joined.select(
        ev.SRC,
        ev.UID,
        ev.DST,
        ev.CMD,
        "outcome",
        "furthest_step",
        F.timestamp_micros(F.col("accepted_ts")).alias("accepted_at"),
        "attempts",
        "retries",
        ((F.col("log_end_ts") - F.col("accepted_ts")) / 1_000_000.0).alias("age_at_log_end_s"),
    )
