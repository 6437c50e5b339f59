"""Where the tables and the report go: a local directory or any URI Hadoop writes (hdfs://, s3a://)."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from spark.ingest import is_uri


def table_path(out: str, name: str) -> str:
    """The directory of table ``name`` under ``out``."""
    return f"{out.rstrip('/')}/{name}"


def write_table(frame: DataFrame, out: str, name: str, single_file: bool = False) -> int:
    """Write ``frame`` as Parquet, replacing an earlier run's table; small tables as a single file. Returns
    the rows written, counted by the write itself."""
    written = Observation(f"rows of {name}")
    observed = frame.observe(written, F.count(F.lit(1)).alias("rows"))
    (observed.coalesce(1) if single_file else observed).write.mode("overwrite").parquet(table_path(out, name))
    return int(written.get["rows"])


def write_text(spark: SparkSession, out: str, name: str, text: str) -> str:
    """Write a UTF-8 file next to the tables (through Hadoop's file system for URIs). A local file is
    written aside and renamed into place: a reader (a browser reloading it) never sees it half-written."""
    path = table_path(out, name)
    if not is_uri(out):
        local = Path(path.removeprefix("file://"))
        local.parent.mkdir(parents=True, exist_ok=True)
        aside = local.with_name(f".{local.name}.{os.getpid()}")
        aside.write_text(text, encoding="utf-8")
        os.replace(aside, local)
        return str(local)
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the job's SparkContext has a JVM"
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    file_system = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = file_system.create(hadoop_path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()
    return path
