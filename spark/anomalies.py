"""Anomalies: a destination's command much slower than it usually is, or a destination whose requests fail
or go unanswered much more often than they usually do.

Each is judged against the destination's own past, not against a fixed bound: the *recent* minutes (those
ending at the time of judgement) against the *baseline* (the hour before them): the recent p99 end to end
against the median of the baseline's per-minute p99, the recent share of failed and expired requests
against the baseline's. A judgement needs enough requests on both sides to mean something
(``AnomalyRules``).
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark.anomaly_rules import MINUTE_US, AnomalyRules
from spark.latency import ACCURACY
from spark.times import Time, as_column
from wire import event_schema as ev

SLOWER: Final = "slower"  # p99 end to end several times the baseline's
FAILING: Final = "failing"  # failed or unanswered share several times the baseline's
END: Final = "_end"  # the time of a judgement
COLUMNS: Final = (
    "kind",
    ev.DST,
    ev.CMD,
    "recent_requests",
    "recent_value",
    "baseline_requests",
    "baseline_value",
    "ratio",
)


def outcome_ts() -> Column:
    return F.coalesce(F.col("delivered_ts"), F.col("failed_ts"), F.col("expired_ts"))


def judge(requests: DataFrame, end_us: Time, rules: AnomalyRules) -> DataFrame:
    """The anomalies as of ``end_us`` (COLUMNS; values: p99 in ms for SLOWER, a share for FAILING)."""
    at, end = outcome_ts(), as_column(end_us)
    window = requests.where((at >= end - rules.span_us) & (at < end)).withColumn(END, end)
    return _judged(window, rules).drop(END)


def judge_minutes(
    requests: DataFrame, first_end_us: Time, last_end_us: Time, rules: AnomalyRules
) -> DataFrame:
    """The anomalies as of the end of each minute, for the minute ends from ``first_end_us`` to
    ``last_end_us``: ``minute`` (the minute that ended) and COLUMNS, in one pass (a request takes part in
    the judgement of every minute end whose recent minutes or baseline its outcome fell in)."""
    at = outcome_ts()
    # The minute ends m with m - span <= at < m.
    low = F.greatest(at - at % MINUTE_US + MINUTE_US, as_column(first_end_us))
    high = F.least(at + rules.span_us, as_column(last_end_us))
    ends = F.when(low <= high, F.sequence(low, high, F.lit(MINUTE_US))).otherwise(F.array())
    window = requests.where(at.isNotNull()).withColumn(END, F.explode(ends))
    judged = _judged(window, rules)
    minute = F.timestamp_micros(F.col(END) - MINUTE_US).alias("minute")
    return judged.select(minute, *COLUMNS)


def _judged(window: DataFrame, rules: AnomalyRules) -> DataFrame:
    marked = window.withColumn(
        "_recent", outcome_ts() >= F.col(END) - rules.recent_minutes * MINUTE_US
    ).withColumn("_failed", F.col("outcome").isin(ev.FAILED, ev.EXPIRED) & F.col("delivered_ts").isNull())
    return _slower(marked, rules).unionByName(_failing(marked, rules))


def _side(recent: bool) -> Column:
    return F.col("_recent") if recent else ~F.col("_recent")


def _p99(value_us: Column) -> Column:
    return F.percentile_approx(value_us, 0.99, ACCURACY)


def _slower(window: DataFrame, rules: AnomalyRules) -> DataFrame:
    delivered = window.where(F.col("end_to_end_us").isNotNull())
    keys = (END, ev.DST, ev.CMD)
    recent = (
        delivered.where(_side(True))
        .groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("recent_requests"),
            (_p99(F.col("end_to_end_us")) / 1000.0).alias("recent_value"),
        )
    )
    # The usual p99: the median of the baseline's minutes' p99, so that a slow stretch does not become the
    # usual before it has lasted half the baseline.
    minute = F.col("delivered_ts") - F.col("delivered_ts") % MINUTE_US
    per_minute = (
        delivered.where(_side(False))
        .groupBy(*keys, minute.alias("_minute"))
        .agg(F.count(F.lit(1)).alias("_n"), _p99(F.col("end_to_end_us")).alias("_p99"))
    )
    baseline = per_minute.groupBy(*keys).agg(
        F.sum("_n").alias("baseline_requests"),
        (F.percentile_approx("_p99", 0.5, ACCURACY) / 1000.0).alias("baseline_value"),
    )
    stats = recent.join(baseline, on=list(keys))
    ratio = F.try_divide(F.col("recent_value"), F.col("baseline_value"))
    judged = stats.where(
        (F.col("recent_requests") >= rules.min_recent)
        & (F.col("baseline_requests") >= rules.min_baseline)
        & (F.col("baseline_value") > 0)
        & (ratio >= rules.latency_factor)
    )
    return _rows(judged, SLOWER, ratio)


def _share(recent: bool) -> Column:
    failed = F.count(F.when(_side(recent) & F.col("_failed"), True))
    # None for a side without requests (which is then not judged).
    return F.try_divide(failed, F.count(F.when(_side(recent), True)))


def _failing(window: DataFrame, rules: AnomalyRules) -> DataFrame:
    stats = window.groupBy(END, ev.DST).agg(
        F.count(F.when(_side(True), True)).alias("recent_requests"),
        _share(True).alias("recent_value"),
        F.count(F.when(_side(False), True)).alias("baseline_requests"),
        _share(False).alias("baseline_value"),
    )
    # A baseline without failures counts as one failure in its requests, so that a jump from none is judged.
    floor = F.greatest(F.col("baseline_value"), F.try_divide(F.lit(1.0), F.col("baseline_requests")))
    ratio = F.try_divide(F.col("recent_value"), floor)
    judged = stats.where(
        (F.col("recent_requests") >= rules.min_recent)
        & (F.col("baseline_requests") >= rules.min_baseline)
        & (F.col("recent_value") >= rules.error_share)
        & (ratio >= rules.error_factor)
    )
    return _rows(judged.withColumn(ev.CMD, F.lit(None).cast("string")), FAILING, ratio)


def _rows(judged: DataFrame, kind: str, ratio: Column) -> DataFrame:
    return judged.withColumn("kind", F.lit(kind)).withColumn("ratio", ratio).select(END, *COLUMNS)
