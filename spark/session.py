"""The SparkSession the job runs in, tuned for the master and the input's size, and left alone under
spark-submit. The shuffle partitions are chosen for the input when the job starts (:mod:`spark.partitioning`),
the JVMs' compilers when the session starts (:mod:`spark.jit`)."""

from __future__ import annotations

import os
import time
from typing import Final

from pyspark.sql import SparkSession

from spark.jit import is_local, java_options

APP_NAME: Final = "msgbus-mine"
DEFAULT_DRIVER_MEMORY: Final = "8g"
EXECUTOR_WAIT_S: Final = 60.0
# How many of the classes Spark generates and compiles for queries it keeps for the next query that needs
# the same. Spark's default, 100, is less than a job uses: a micro-batch of --follow runs about 220, the
# batch job about 290, and each was compiled again every time (a third of a micro-batch's CPU).
CODEGEN_CACHE: Final = "spark.sql.codegen.cache.maxEntries"
CODEGEN_CACHE_ENTRIES: Final = "1000"


def under_spark_submit() -> bool:
    """True when spark-submit started this Python driver (its JVM is already running, with its own conf)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None, driver_memory: str = DEFAULT_DRIVER_MEMORY, input_bytes: int | None = None
) -> SparkSession:
    """A session for the job over ``input_bytes`` of input (None: not known). Without spark-submit the driver
    JVM is started here, so its memory and compilers can be set; ``master`` defaults to ``local[*]`` then.
    Under spark-submit its flags decide (``--driver-memory``, ``--conf``).
    """
    builder = SparkSession.builder.appName(APP_NAME)
    if master is not None:
        builder = builder.master(master)
    if not under_spark_submit():
        master = master or "local[*]"
        builder = builder.master(master).config("spark.driver.memory", driver_memory)
        for key, value in java_options(master, input_bytes).items():
            builder = builder.config(key, value)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        # De-duplication groups by every field; longer plans than Spark's default of 25 fields are expected.
        .config("spark.sql.debug.maxToStringFields", "100")
        # The shuffle partitions are sized for the input (spark.partitioning); adaptive execution would
        # split each query into more jobs, each a round trip to the executors on a cluster.
        .config("spark.sql.adaptive.enabled", "false")
        # The parsed rows and the requests are persisted and read by every table: compressing them costs
        # more CPU than it saves (10M events: 93 s against 98 s); what does not fit in memory goes to disk.
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        .config(CODEGEN_CACHE, CODEGEN_CACHE_ENTRIES)
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    wait_for_an_executor(spark)
    return spark


def wait_for_an_executor(spark: SparkSession, timeout_s: float = EXECUTOR_WAIT_S) -> bool:
    """On a cluster, executors register a moment after the session starts, and until one has, Spark
    counts 2 cores (``defaultParallelism``), which the shuffle partitions are sized from. Wait for the
    first (the first job would wait for it anyway); False if none came within ``timeout_s``."""
    context = spark.sparkContext
    if is_local(context.master or "local"):
        return True
    deadline = time.monotonic() + timeout_s
    # The driver is listed as an executor too.
    while len(context.statusTracker().getExecutorInfos()) < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
