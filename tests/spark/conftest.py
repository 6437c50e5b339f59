"""One local SparkSession for the whole Spark test run: 2 cores, 2 shuffle partitions, no UI, and C1 alone
(tiny frames, as the job compiles for a small input: spark.jit), with room for the code of all the tests'
queries (C1 alone reserves 48 MB for compiled code, which the stream's queries fill: then the JVM stops
compiling), and Spark's generated classes kept as the job keeps them (spark.session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark.jit import C1_ONLY, DRIVER_OPTIONS
from spark.session import CODEGEN_CACHE, CODEGEN_CACHE_ENTRIES


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("msgbus-mine-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config(DRIVER_OPTIONS, f"{C1_ONLY} -XX:ReservedCodeCacheSize=240m")
        .config(CODEGEN_CACHE, CODEGEN_CACHE_ENTRIES)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
