"""Latency tables from the request timeline: percentiles end to end, per hour, per hop, and the slowest
destinations. Percentiles are approximate (``percentile_approx``, relative error about 1/ACCURACY) and in
milliseconds; exact for groups of a few values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark.timeline import HOPS
from wire import event_schema as ev

ACCURACY: Final = 10_000
PERCENTILES: Final = (0.5, 0.9, 0.99)
STAT_COLUMNS: Final = ("samples", "p50_ms", "p90_ms", "p99_ms", "max_ms")


def stat_aggregates(value_us: Column) -> list[Column]:
    """The aggregates that ``stat_columns`` turns into STAT_COLUMNS."""
    return [
        F.count(value_us).alias("samples"),
        F.percentile_approx(value_us, list(PERCENTILES), ACCURACY).alias("_p"),
        F.max(value_us).alias("_max"),
    ]


def stat_columns() -> list[Column]:
    return [
        F.col("samples"),
        *(
            (F.col("_p")[index] / 1000.0).alias(name)
            for index, name in enumerate(("p50_ms", "p90_ms", "p99_ms"))
        ),
        (F.col("_max") / 1000.0).alias("max_ms"),
    ]


def latency_stats(frame: DataFrame, value_us: str, keys: Sequence[str]) -> DataFrame:
    """Per ``keys``: samples (non-null values) and p50/p90/p99/max of ``value_us`` in milliseconds."""
    measured = frame.where(F.col(value_us).isNotNull())
    grouped = measured.groupBy(*keys).agg(*stat_aggregates(F.col(value_us)))
    return grouped.select(*keys, *stat_columns())


def with_hour(requests: DataFrame) -> DataFrame:
    """``requests`` plus ``hour``: the UTC hour its source site accepted it."""
    return requests.withColumn("hour", F.date_trunc("hour", F.timestamp_micros(F.col("accepted_ts"))))


def end_to_end_latency(requests: DataFrame) -> DataFrame:
    """accepted -> delivered at the source site, per (src, dst, cmd)."""
    return latency_stats(requests, "end_to_end_us", (ev.SRC, ev.DST, ev.CMD))


def end_to_end_latency_hourly(requests: DataFrame) -> DataFrame:
    """accepted -> delivered, per (hour accepted, src, dst, cmd)."""
    return latency_stats(with_hour(requests), "end_to_end_us", ("hour", ev.SRC, ev.DST, ev.CMD))


def hop_latency(
    requests: DataFrame, keys: Sequence[str] = (ev.SRC, ev.DST, ev.CMD), *, with_end_to_end: bool = False
) -> DataFrame:
    """Per (``keys``, hop): the hop's percentiles, and ``cross_host``: requests whose reply path was not
    measured because its two ends ran on different hosts (different clocks). ``with_end_to_end`` adds
    ``end_to_end`` as one more "hop". One pass over ``requests``.
    """
    both_reply_ends = F.col("reply_taken_ts").isNotNull() & F.col("reply_received_ts").isNotNull()
    cross_host = both_reply_ends & ~F.col("same_host")
    measures = [(hop.removesuffix("_us"), hop) for hop in HOPS]
    if with_end_to_end:
        measures.insert(0, ("end_to_end", "end_to_end_us"))
    entries = F.array(
        *(
            F.struct(
                F.lit(name).alias("hop"),
                F.col(column).alias("value_us"),
                (cross_host if column == "reply_path_us" else F.lit(False)).alias("_cross"),
            )
            for name, column in measures
        )
    )
    long = requests.select(*keys, F.explode(entries).alias("_m")).select(*keys, "_m.*")
    grouped = long.groupBy(*keys, "hop").agg(
        *stat_aggregates(F.col("value_us")), F.count(F.when(F.col("_cross"), True)).alias("cross_host")
    )
    return grouped.where((F.col("samples") > 0) | (F.col("cross_host") > 0)).select(
        *keys, "hop", *stat_columns(), "cross_host"
    )


def slowest_destinations(requests: DataFrame) -> DataFrame:
    """Destinations ranked by p99 end-to-end latency, slowest first (``rank`` 1)."""
    stats = latency_stats(requests, "end_to_end_us", (ev.DST,))
    # One small row per destination, so a single window partition is fine. A literal key would be optimised
    # away (and Spark would warn about moving all data to one partition): `samples` is always positive.
    everything = Window.partitionBy(F.col("samples") > 0)
    order = F.row_number().over(
        everything.orderBy(F.col("p99_ms").desc(), F.col("p50_ms").desc(), F.col(ev.DST))
    )
    return stats.select(order.alias("rank"), *stats.columns)
