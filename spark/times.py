"""Times that queries compare with: given as numbers (microseconds since the epoch), or as columns.

Spark writes a literal's value into the Java code it generates for a query, so a query run again with a
new time is compiled again. The follower gives its times as the columns of a one-row frame joined to its
data (:func:`with_times`): with Spark's cache of compiled classes large enough (spark.session), a
micro-batch after the first compiles 4 classes instead of about 200, and costs a third less CPU.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

Time = int | Column


def as_column(time: Time) -> Column:
    return time if isinstance(time, Column) else F.lit(time)


def times_frame(spark: SparkSession, times: dict[str, int]) -> DataFrame:
    """One row: a column of type long per name."""
    schema = ", ".join(f"{name} long" for name in times)
    return spark.createDataFrame([tuple(times.values())], schema)


def with_times(frame: DataFrame, times: DataFrame) -> DataFrame:
    """``frame`` with the columns of the one-row frame ``times`` on each row."""
    return frame.crossJoin(F.broadcast(times))
