"""How many shuffle partitions the job uses: from the cores the session has and the size of its input.

Every table is an aggregate of the parsed lines, so the shuffles carry about as much as the input. Spark's
default of 200 partitions is meant for large inputs on large clusters; on a few cores with a few hundred
MB, each of those tasks costs more to schedule than to run (on a standalone cluster, where every task is
a message to an executor, a 200k-event run took 3.5x as long as with one partition per core).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Final

from pyspark.sql import SparkSession

# Input bytes (JSON text) per shuffle partition at the most.
TARGET_PARTITION_BYTES: Final = 64 * 1024 * 1024
SHUFFLE_PARTITIONS: Final = "spark.sql.shuffle.partitions"


def shuffle_partitions(cores: int, input_bytes: int | None) -> int:
    """A multiple of ``cores``: one partition per core, and more rounds of them while a partition would
    hold more than TARGET_PARTITION_BYTES of input. Unknown size: four per core."""
    cores = max(1, cores)
    if input_bytes is None:
        return 4 * cores
    return cores * max(1, math.ceil(input_bytes / (TARGET_PARTITION_BYTES * cores)))


def input_bytes(spark: SparkSession, paths: Sequence[str]) -> int | None:
    """The total size of ``paths`` (files or directories; local, or any URI Hadoop reads), or None if it
    cannot be told."""
    return _total_size(paths, spark)


def local_input_bytes(paths: Sequence[str]) -> int | None:
    """The total size of ``paths`` when they are all local files or directories (before Spark starts), else
    None."""
    return _total_size(paths, None)


def choose_shuffle_partitions(spark: SparkSession, paths: Sequence[str]) -> int:
    """Set the session's shuffle partitions from its cores and the input, unless they were configured
    (``--conf spark.sql.shuffle.partitions=N``, ``--shuffle-partitions``); returns the number in force."""
    if not spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):
        chosen = shuffle_partitions(spark.sparkContext.defaultParallelism, input_bytes(spark, paths))
        spark.conf.set(SHUFFLE_PARTITIONS, str(chosen))
    return int(spark.conf.get(SHUFFLE_PARTITIONS) or 0)


def _total_size(paths: Sequence[str], spark: SparkSession | None) -> int | None:
    total = 0
    for path in paths:
        size = _local_size(path) if "://" not in path or path.startswith("file://") else None
        if size is None and spark is not None:
            size = _hadoop_size(spark, path)
        if size is None:
            return None
        total += size
    return total


def _local_size(path: str) -> int | None:
    local = path.removeprefix("file://")
    try:
        if os.path.isdir(local):
            return sum(
                os.path.getsize(os.path.join(folder, name))
                for folder, _, names in os.walk(local)
                for name in names
            )
        return os.path.getsize(local)
    except OSError:
        return None


def _hadoop_size(spark: SparkSession, path: str) -> int | None:
    """Through the driver JVM's Hadoop file systems (hdfs://, s3a://, ...); globs are expanded."""
    try:
        jvm = spark.sparkContext._jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)  # type: ignore[union-attr]
        fs = hadoop_path.getFileSystem(conf)
        matches = fs.globStatus(hadoop_path) or []
        return sum(int(fs.getContentSummary(status.getPath()).getLength()) for status in matches)
    except Exception:  # a file system without a connector, no permission, no JVM access: size unknown
        return None
