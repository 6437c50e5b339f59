from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from spark.partitioning import (
    TARGET_PARTITION_BYTES,
    choose_shuffle_partitions,
    input_bytes,
    local_input_bytes,
    shuffle_partitions,
)


def test_one_partition_per_core_until_the_input_is_large() -> None:
    assert shuffle_partitions(2, 0) == 2
    assert shuffle_partitions(2, 28_000_000) == 2
    assert shuffle_partitions(2, 2 * TARGET_PARTITION_BYTES) == 2
    assert shuffle_partitions(2, 2 * TARGET_PARTITION_BYTES + 1) == 4
    assert shuffle_partitions(8, 1_400_000_000) == 24
    assert shuffle_partitions(0, 10) == 1
    assert shuffle_partitions(4, None) == 16


def test_the_input_size_is_read_from_files_directories_and_uris(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"x" * 100)
    (folder / "b.jsonl").write_bytes(b"x" * 50)
    (tmp_path / "backlog.jsonl").write_bytes(b"x" * 7)
    assert input_bytes(spark, [str(folder), str(tmp_path / "backlog.jsonl")]) == 157
    # Globs in URIs are Hadoop's to expand.
    assert input_bytes(spark, [f"file:{folder}/*.jsonl"]) == 150
    assert input_bytes(spark, [str(tmp_path / "missing")]) == 0


def test_the_size_of_local_inputs_is_known_before_spark_starts(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"x" * 100)
    (tmp_path / "backlog.jsonl").write_bytes(b"x" * 7)
    assert local_input_bytes([str(folder), f"file://{tmp_path / 'backlog.jsonl'}"]) == 107
    assert local_input_bytes([]) == 0
    # A URI needs Spark's file systems, and a path that is gone has no size.
    assert local_input_bytes([str(folder), "hdfs://namenode/msgbus/events"]) is None
    assert local_input_bytes([str(tmp_path / "missing")]) is None


def test_a_configured_number_is_kept(spark: SparkSession, tmp_path: Path) -> None:
    # The test session sets spark.sql.shuffle.partitions itself.
    assert choose_shuffle_partitions(spark, [str(tmp_path)]) == 2
