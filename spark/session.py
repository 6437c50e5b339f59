"""The SparkSession the job runs in, tuned for local runs and left alone under spark-submit."""

from __future__ import annotations

import os
from typing import Final

from pyspark.sql import SparkSession

APP_NAME: Final = "msgbus-mine"
DEFAULT_DRIVER_MEMORY: Final = "8g"
# Shuffle partitions per local core: enough to spread a skewed key, few enough that tiny tasks do not
# dominate (the default of 200 is meant for clusters).
PARTITIONS_PER_CORE: Final = 4


def under_spark_submit() -> bool:
    """True when spark-submit started this Python driver (its JVM is already running, with its own conf)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None, driver_memory: str = DEFAULT_DRIVER_MEMORY, shuffle_partitions: int | None = None
) -> SparkSession:
    """A session for the job. Without spark-submit the driver JVM is started here, so its memory can be set;
    ``master`` defaults to ``local[*]`` then. Under spark-submit its flags decide (``--driver-memory``).
    """
    builder = SparkSession.builder.appName(APP_NAME)
    if master is not None:
        builder = builder.master(master)
    if not under_spark_submit():
        if master is None:
            builder = builder.master("local[*]")
        builder = builder.config("spark.driver.memory", driver_memory)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        # De-duplication groups by every field; longer plans than Spark's default of 25 fields are expected.
        .config("spark.sql.debug.maxToStringFields", "100")
        # The job's tables are small aggregates; let adaptive execution merge tiny shuffle partitions.
        .config("spark.sql.adaptive.enabled", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    elif (spark.sparkContext.master or "").startswith("local"):
        cores = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, PARTITIONS_PER_CORE * cores)))
    return spark
