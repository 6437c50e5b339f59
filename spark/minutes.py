"""Tables by the UTC minute: what the batch job writes over whole logs, and what ``msgbus mine --follow``
appends as each minute closes. Both compute them with these functions over the same rows, so a followed
log and the same files mined in a batch give the same tables.

A request counts in the minute its outcome came at its source site: its latency in the minute it was
delivered, and it is *unanswered* in the minute its lifetime ended without an answer (``expired``). An error
event counts in the minute it was logged, an event in the throughput of the minute it was logged.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark import failures, latency, throughput
from spark.times import Time, as_column
from wire import event_schema as ev

MINUTE: Final = "minute"
# The per-minute tables, by name.
LATENCY: Final = "latency_per_minute"
ERRORS: Final = "errors_per_minute"
THROUGHPUT: Final = "throughput_per_minute"
UNANSWERED: Final = "unanswered_per_minute"
TABLES: Final = (LATENCY, ERRORS, THROUGHPUT, UNANSWERED)


def minute_of(ts_us: Column) -> Column:
    """The UTC minute (a timestamp) of a time in microseconds since the epoch."""
    return F.date_trunc("minute", F.timestamp_micros(ts_us))


def in_minutes(ts_us: Column, first_us: Time | None, end_us: Time | None) -> Column:
    """``ts_us`` within [first_us, end_us) (either bound may be open)."""
    inside: Column = ts_us.isNotNull()
    if first_us is not None:
        inside = inside & (ts_us >= as_column(first_us))
    if end_us is not None:
        inside = inside & (ts_us < as_column(end_us))
    return inside


def latency_per_minute(
    requests: DataFrame, first_us: Time | None = None, end_us: Time | None = None
) -> DataFrame:
    """Per (minute delivered, src, dst, cmd, hop): percentiles of each hop and of ``end_to_end``."""
    delivered = requests.where(in_minutes(F.col("delivered_ts"), first_us, end_us))
    keyed = delivered.withColumn(MINUTE, minute_of(F.col("delivered_ts")))
    return latency.hop_latency(keyed, (MINUTE, ev.SRC, ev.DST, ev.CMD), with_end_to_end=True)


def errors_per_minute(
    events: DataFrame, first_us: Time | None = None, end_us: Time | None = None
) -> DataFrame:
    """Per (minute, dst, event, cause): the error events logged in that minute."""
    errors = events.where(
        F.col(ev.EVENT).isin(*failures.ERROR_EVENTS) & in_minutes(F.col(ev.TS), first_us, end_us)
    )
    keyed = errors.select(
        minute_of(F.col(ev.TS)).alias(MINUTE),
        failures.error_destination().alias(ev.DST),
        F.col(ev.EVENT),
        failures.error_cause().alias("cause"),
    )
    return keyed.groupBy(MINUTE, ev.DST, ev.EVENT, "cause").agg(F.count(F.lit(1)).alias("events"))


def throughput_per_minute(
    events: DataFrame, first_us: Time | None = None, end_us: Time | None = None
) -> DataFrame:
    """Per (minute, site): the events it logged, by kind, and the bytes of the requests it accepted."""
    return throughput.throughput_per_minute(events.where(in_minutes(F.col(ev.TS), first_us, end_us)))


def unanswered_per_minute(
    requests: DataFrame, first_us: Time | None = None, end_us: Time | None = None
) -> DataFrame:
    """Requests whose lifetime ended without an answer, in the minute it ended, with where they stopped."""
    expired = requests.where(
        in_minutes(F.col("expired_ts"), first_us, end_us) & (F.col("outcome") == ev.EXPIRED)
    )
    return expired.select(
        minute_of(F.col("expired_ts")).alias(MINUTE),
        ev.SRC,
        ev.UID,
        ev.DST,
        ev.CMD,
        "furthest_step",
        F.timestamp_micros(F.col("accepted_ts")).alias("accepted_at"),
        "attempts",
    )


def per_minute_tables(
    events: DataFrame, requests: DataFrame, first_us: Time | None = None, end_us: Time | None = None
) -> dict[str, DataFrame]:
    """The four tables over the minutes in [first_us, end_us) (all of them when open)."""
    return {
        LATENCY: latency_per_minute(requests, first_us, end_us),
        ERRORS: errors_per_minute(events, first_us, end_us),
        THROUGHPUT: throughput_per_minute(events, first_us, end_us),
        UNANSWERED: unanswered_per_minute(requests, first_us, end_us),
    }
