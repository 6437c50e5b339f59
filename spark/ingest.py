"""Reading event logs and backlog snapshots: malformed lines counted and set aside, the time window applied,
exact duplicates dropped. The transforms are pure; ``load`` is the one place that reads files and counts.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark.schema import CORRUPT_RECORD, backlog_schema, event_schema, with_corrupt_record
from wire import event_schema as ev

# Why a line was set aside; null for the lines that are kept.
DISPOSITION: Final = "_disposition"
NOT_JSON: Final = "not valid JSON for the schema"
OUTSIDE_WINDOW: Final = "outside --since/--until"
COPIES: Final = "_copies"
# How the parsed lines and the requests are kept. PySpark's MEMORY_AND_DISK is the serialized level: a block
# read back from disk is then copied whole into one buffer on the heap, which ran a 1 GiB executor (Spark's
# default) out of memory at 10M events and cost its cached blocks; the deserialized level reads it in steps.
PERSISTED: Final = StorageLevel.MEMORY_AND_DISK_DESER


@dataclass(frozen=True)
class Source:
    """What makes a line of one kind of input valid."""

    name: str  # "events" or "backlog", for messages
    schema: StructType
    time_column: str  # microseconds since the epoch, for --since/--until
    required: tuple[str, ...]
    name_column: str  # a column whose value must be one of `known`
    known: tuple[str, ...]
    # The rows are hash-partitioned by these columns before de-duplication. For events it is the request key:
    # de-duplication (grouping by every column) and the request timeline (grouping by src, uid) then both
    # find their rows where they are, and the persisted rows keep that partitioning: one shuffle for both.
    partition_by: tuple[str, ...]


EVENTS: Final = Source(
    "events",
    event_schema(),
    ev.TS,
    (ev.TS, ev.SITE, ev.EVENT),
    ev.EVENT,
    ev.EVENTS,
    partition_by=(ev.SRC, ev.UID),
)
BACKLOG: Final = Source(
    "backlog",
    backlog_schema(),
    ev.TAKEN_AT,
    (ev.TAKEN_AT, ev.SITE, ev.KIND),
    ev.KIND,
    ev.BACKLOG_KINDS,
    partition_by=(ev.SITE, ev.UID),
)


def classify_lines(raw: DataFrame, source: Source) -> DataFrame:
    """``raw`` (parsed with the corrupt-record column) plus DISPOSITION: why a line is malformed, or null."""
    missing = reduce(or_, (F.col(name).isNull() for name in source.required))
    reason = (
        F.when(F.col(CORRUPT_RECORD).isNotNull(), F.lit(NOT_JSON))
        .when(missing, F.lit("missing " + ", ".join(source.required)))
        .when(~F.col(source.name_column).isin(*source.known), F.lit(f"unknown {source.name_column}"))
    )
    return raw.withColumn(DISPOSITION, reason)


def mark_outside_window(
    classified: DataFrame, time_column: str, since_us: int | None, until_us: int | None
) -> DataFrame:
    """Valid lines before ``since_us`` or at/after ``until_us`` get the OUTSIDE_WINDOW disposition."""
    outside: Column = F.lit(False)
    if since_us is not None:
        outside = outside | (F.col(time_column) < since_us)
    if until_us is not None:
        outside = outside | (F.col(time_column) >= until_us)
    return classified.withColumn(
        DISPOSITION,
        F.when(F.col(DISPOSITION).isNull() & outside, F.lit(OUTSIDE_WINDOW)).otherwise(F.col(DISPOSITION)),
    )


def deduplicated(classified: DataFrame) -> DataFrame:
    """One row per distinct line (all columns equal), with COPIES: how many times it was read."""
    return classified.groupBy(*classified.columns).agg(F.count(F.lit(1)).alias(COPIES))


def kept_rows(distinct: DataFrame) -> DataFrame:
    """The lines to mine (from ``deduplicated``), without the bookkeeping columns."""
    return distinct.where(F.col(DISPOSITION).isNull()).drop(DISPOSITION, CORRUPT_RECORD, COPIES)


def is_uri(path: str) -> bool:
    """True for ``scheme://...`` paths that Spark (Hadoop) resolves; False for local paths and globs."""
    return "://" in path and not path.startswith("file://")


def resolve_paths(patterns: Sequence[str]) -> tuple[list[str], list[str]]:
    """Expand local globs into (paths to read, local patterns that matched nothing); URIs pass as they are."""
    found: list[str] = []
    unmatched: list[str] = []
    for pattern in patterns:
        if is_uri(pattern):
            found.append(pattern)
            continue
        local = pattern.removeprefix("file://")
        matches = sorted(glob.glob(os.path.expanduser(local)))
        if matches:
            found.extend(matches)
        else:
            unmatched.append(pattern)
    return found, unmatched


def read_json_lines(spark: SparkSession, paths: Sequence[str], schema: StructType) -> DataFrame:
    """Parse JSON lines once against ``schema``; lines that do not fit keep their text in CORRUPT_RECORD."""
    full = with_corrupt_record(schema)
    if not paths:
        return spark.createDataFrame([], full)
    return (
        spark.read.schema(full)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
        .json(list(paths))
    )


@dataclass(frozen=True)
class Loaded:
    """One input, parsed once and persisted, with what was set aside."""

    rows: DataFrame  # the kept lines, each once; read from `cached`
    cached: DataFrame  # persisted: every distinct line with its disposition; release() when done
    lines: int  # non-blank lines read
    set_aside: dict[str, int]  # disposition -> lines (malformed reasons and OUTSIDE_WINDOW)
    duplicates: int  # exact copies of kept lines, dropped
    unmatched: list[str]  # local patterns that matched no file
    # The kept lines' earliest and latest time (microseconds), and the sites that wrote them.
    first_us: int | None = None
    last_us: int | None = None
    sites: list[int] = field(default_factory=list)

    @property
    def malformed(self) -> dict[str, int]:
        return {reason: n for reason, n in self.set_aside.items() if reason != OUTSIDE_WINDOW}

    @property
    def kept(self) -> int:
        return self.lines - sum(self.set_aside.values()) - self.duplicates

    def release(self) -> None:
        self.cached.unpersist()


def load(
    spark: SparkSession, patterns: Sequence[str], source: Source, since_us: int | None, until_us: int | None
) -> Loaded:
    """Read, classify and de-duplicate one input in one pass over the files; the distinct lines are persisted
    and every later table reads them from there.
    """
    paths, unmatched = resolve_paths(patterns)
    raw = read_json_lines(spark, paths, source.schema)
    classified = mark_outside_window(classify_lines(raw, source), source.time_column, since_us, until_us)
    partitioned = classified.repartition(*source.partition_by)
    cached = deduplicated(partitioned).persist(PERSISTED)
    counts = cached.groupBy(DISPOSITION).agg(
        F.sum(COPIES).alias("lines"),
        F.count(F.lit(1)).alias("distinct"),
        F.min(source.time_column).alias("first"),
        F.max(source.time_column).alias("last"),
        F.collect_set(ev.SITE).alias("sites"),
    )
    set_aside: dict[str, int] = {}
    valid_lines = kept = 0
    first_us = last_us = None
    sites: list[int] = []
    for row in counts.collect():
        if row[DISPOSITION] is None:
            valid_lines, kept = int(row["lines"]), int(row["distinct"])
            first_us, last_us, sites = row["first"], row["last"], sorted(row["sites"])
        else:
            set_aside[row[DISPOSITION]] = int(row["lines"])
    return Loaded(
        rows=kept_rows(cached),
        cached=cached,
        lines=valid_lines + sum(set_aside.values()),
        set_aside=set_aside,
        duplicates=valid_lines - kept,
        unmatched=unmatched,
        first_us=first_us,
        last_us=last_us,
        sites=sites,
    )
