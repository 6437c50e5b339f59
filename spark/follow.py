"""``msgbus mine --follow``: Spark Structured Streaming over a directory of event logs, as they are written.

The stream takes each complete file once (``*.jsonl``: a daemon names a file so only when it is complete)
and hands each micro-batch to :class:`Follower`, which

1. parses its lines as the batch job does (malformed lines counted and skipped, exact copies dropped) and
   keeps them in ``OUT/kept_events/batch=N``, for as long as a later batch may look back to them (the
   anomalies' windows and ``lookback_s``);
2. moves the watermark: the newest event time read, less ``watermark_s``. A minute closes once the watermark
   is past its end; an event that comes for a minute already closed is counted as *late* and left out of
   that minute. Sites' clocks differ by tens of milliseconds, and a file reaches the stream when it is
   rotated: ``watermark_s`` must cover the rotation period;
3. writes the minutes that closed, from every event kept so far (the requests' earlier events looked for up
   to ``lookback_s`` back): the per-minute tables (:mod:`spark.minutes`) and the ``anomalies`` judged at the
   end of each closed minute (:mod:`spark.anomalies`), under ``OUT/<table>/batch=N``;
4. rewrites the "now" view (``now.json``, ``now.html``) and saves its state under ``OUT/follow_state``.

Exactly once across restarts: Spark's checkpoint gives a restarted query the same files for a batch it had
not finished, and everything a batch writes is keyed by its number (written again whole, never added to),
and its state read from the batch before it. So a batch done twice writes what it wrote the first time, and
no minute is written by two batches (each closes the minutes between the last one's watermark and its own).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark import anomalies, minutes, now_view
from spark.anomaly_rules import MINUTE_US, AnomalyRules
from spark.ingest import COPIES, DISPOSITION, EVENTS, classify_lines, deduplicated, kept_rows
from spark.outputs import table_path, write_text
from spark.schema import CORRUPT_RECORD, with_corrupt_record
from spark.timeline import request_timeline
from spark.times import times_frame, with_times
from wire import event_schema as ev

# Spark passes over directories whose names start with "_" or ".": these are plain names.
EVENTS_STORE: Final = "kept_events"
STATE: Final = "follow_state"
ANOMALIES: Final = "anomalies"
BATCH: Final = "batch"
QUERY_NAME: Final = "msgbus-follow"
# A micro-batch's times, as columns joined to its data (spark.times): the minutes it closes, the newest event.
CLOSING_FROM: Final = "_closing_from"
CLOSED_UNTIL: Final = "_closed_until"
NEWEST: Final = "_newest"


@dataclass(frozen=True)
class FollowOptions:
    events: str  # the directory the daemons write their event logs to
    out: str
    checkpoint: str
    trigger_s: float = 5.0
    watermark_s: float = 30.0
    lookback_s: float = 3600.0
    rules: AnomalyRules = field(default_factory=AnomalyRules)


@dataclass
class FollowState:
    """What one batch leaves for the next (times in microseconds since the epoch)."""

    newest_us: int | None = None
    closed_until_us: int | None = None  # every minute before this one is written
    lines: int = 0
    kept: int = 0
    duplicates: int = 0
    late: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    # The batches whose kept events are still stored, each with the newest time read once it was done:
    # none of its events is newer.
    stored: list[list[int]] = field(default_factory=list)


def minute_floor(ts_us: int) -> int:
    return ts_us - ts_us % MINUTE_US


def start(spark: SparkSession, options: FollowOptions) -> StreamingQuery:
    """Start following ``options.events``; the query runs until stopped."""
    lines = (
        spark.readStream.schema(with_corrupt_record(EVENTS.schema))
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
        .option("pathGlobFilter", "*.jsonl")
        .json(options.events)
    )
    follower = Follower(spark, options)
    return (
        lines.writeStream.foreachBatch(follower.handle)
        .option("checkpointLocation", options.checkpoint)
        .trigger(processingTime=f"{options.trigger_s:g} seconds")
        .queryName(QUERY_NAME)
        .start()
    )


class Follower:
    """Handles each micro-batch (see the module's description)."""

    def __init__(self, spark: SparkSession, options: FollowOptions) -> None:
        self.spark = spark
        self.options = options
        self.out = options.out
        # The state the last batch saved, so that the next need not read it back.
        self._last: tuple[int, FollowState] | None = None

    def handle(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        state = self._state_before(batch_id)
        first_read = self._keep(batch, batch_id, state)
        if state.newest_us is None:
            return self._save(batch_id, state)
        if state.closed_until_us is None:
            state.closed_until_us = minute_floor(first_read if first_read is not None else state.newest_us)
        closing_from = state.closed_until_us
        closed_until = max(closing_from, minute_floor(state.newest_us - int(self.options.watermark_s * 1e6)))
        # One timeline of the requests serves the minutes that close and the view.
        rules = self.options.rules
        since = min(
            rules.baseline_start_us(closing_from + MINUTE_US),
            rules.baseline_start_us(state.newest_us),
            state.newest_us - now_view.WINDOW_S * 1_000_000,
        ) - int(self.options.lookback_s * 1e6)
        self._let_go(state, since)
        events = self._events(batch_id, since).persist()
        requests = request_timeline(events).persist()
        times = times_frame(
            self.spark, {CLOSING_FROM: closing_from, CLOSED_UNTIL: closed_until, NEWEST: state.newest_us}
        )
        try:
            if closed_until > closing_from:
                self._close_minutes(batch_id, with_times(events, times), with_times(requests, times))
                state.closed_until_us = closed_until
            self._save(batch_id, state)
            self._write_now(with_times(requests, times), state, batch_id, time.monotonic() - started)
        finally:
            requests.unpersist()
            events.unpersist()
        return None

    # --- 1: the batch's lines ------------------------------------------------------------------------

    def _keep(self, batch: DataFrame, batch_id: int, state: FollowState) -> int | None:
        """Count the batch's lines into ``state`` and keep its valid ones; returns its earliest time."""
        distinct = deduplicated(classify_lines(batch, EVENTS)).persist()
        try:
            counts = distinct.groupBy(DISPOSITION).agg(
                F.sum(COPIES).alias("lines"),
                F.count(F.lit(1)).alias("distinct"),
                F.min(ev.TS).alias("first"),
                F.max(ev.TS).alias("last"),
                F.count(F.when(F.col(ev.TS) < (state.closed_until_us or 0), True)).alias("late"),
            )
            first = None
            for row in counts.collect():
                state.lines += int(row["lines"])
                if row[DISPOSITION] is None:
                    state.kept += int(row["distinct"])
                    state.duplicates += int(row["lines"]) - int(row["distinct"])
                    state.late += int(row["late"])
                    first = row["first"]
                    state.newest_us = max(state.newest_us or row["last"], row["last"])
                else:
                    reason = str(row[DISPOSITION])
                    state.malformed[reason] = state.malformed.get(reason, 0) + int(row["lines"])
            kept_rows(distinct).write.mode("overwrite").parquet(self._batch_path(EVENTS_STORE, batch_id))
        finally:
            distinct.unpersist()
        state.batches += 1
        if state.newest_us is not None:
            state.stored.append([batch_id, state.newest_us])
        return None if first is None else int(first)

    def _let_go(self, state: FollowState, since_us: int) -> None:
        """Delete the kept events of the batches that hold none from ``since_us`` on: no batch from this one
        on looks that far back (``since_us`` only moves forward), so a job that runs for days reads an
        hour or so of events per micro-batch, not all it ever read."""
        for batch in events_older_than(state.stored, since_us):
            self._delete(self._batch_path(EVENTS_STORE, batch))
        state.stored = [[batch, newest] for batch, newest in state.stored if newest >= since_us]

    def _events(self, batch_id: int, since_us: int) -> DataFrame:
        """Every event kept by the batches up to ``batch_id`` (not by a later one: a batch done again after
        a restart reads what it read the first time), from ``since_us`` on, each once."""
        stored = self.spark.read.parquet(table_path(self.out, EVENTS_STORE))
        kept = stored.where((F.col(BATCH) <= batch_id) & (F.col(ev.TS) >= since_us)).drop(BATCH)
        return kept.dropDuplicates()

    # --- 3: the minutes that closed ------------------------------------------------------------------

    def _close_minutes(self, batch_id: int, events: DataFrame, requests: DataFrame) -> None:
        """The minutes from CLOSING_FROM to CLOSED_UNTIL, columns of ``events`` and ``requests``."""
        first, end = F.col(CLOSING_FROM), F.col(CLOSED_UNTIL)
        for name, frame in minutes.per_minute_tables(events, requests, first, end).items():
            frame.write.mode("overwrite").parquet(self._batch_path(name, batch_id))
        found = anomalies.judge_minutes(requests, first + MINUTE_US, end, self.options.rules)
        found.write.mode("overwrite").parquet(self._batch_path(ANOMALIES, batch_id))

    # --- 4: the view and the state -------------------------------------------------------------------

    def _write_now(self, requests: DataFrame, state: FollowState, batch_id: int, took_s: float) -> None:
        assert state.newest_us is not None
        progress = {
            "batch": batch_id,
            "batch_s": round(took_s, 2),
            "closed_until": now_view.iso(state.closed_until_us),
            **{
                key: value
                for key, value in asdict(state).items()
                if key not in ("newest_us", "closed_until_us", "stored")
            },
        }
        view = now_view.now_view(requests, state.newest_us, self.options.rules, progress, F.col(NEWEST))
        write_text(self.spark, self.out, "now.json", now_view.as_json(view))
        write_text(self.spark, self.out, "now.html", now_view.as_html(view))

    def _state_before(self, batch_id: int) -> FollowState:
        if self._last is not None and self._last[0] == batch_id - 1:
            return FollowState(**asdict(self._last[1]))
        if not self._exists(table_path(self.out, STATE)):
            return FollowState()
        saved = self.spark.read.parquet(table_path(self.out, STATE))
        rows = saved.where(F.col(BATCH) < batch_id).orderBy(F.col(BATCH).desc()).limit(1).collect()
        return FollowState(**json.loads(rows[0]["state"])) if rows else FollowState()

    def _save(self, batch_id: int, state: FollowState) -> None:
        row = self.spark.createDataFrame([(json.dumps(asdict(state)),)], "state string")
        row.coalesce(1).write.mode("overwrite").parquet(self._batch_path(STATE, batch_id))
        self._last = (batch_id, FollowState(**asdict(state)))
        # A batch done again reads the state of the batch before it: older ones are not read again.
        if batch_id >= 2:
            self._delete(self._batch_path(STATE, batch_id - 2))

    def _exists(self, path: str) -> bool:
        file_system, hadoop_path = self._hadoop(path)
        return bool(file_system.exists(hadoop_path))

    def _delete(self, path: str) -> None:
        file_system, hadoop_path = self._hadoop(path)
        file_system.delete(hadoop_path, True)

    def _hadoop(self, path: str) -> tuple[Any, Any]:
        """The Hadoop file system of ``path`` (local, HDFS, S3 ...) and the path as it knows it."""
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None, "the job's SparkContext has a JVM"
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        return hadoop_path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path

    def _batch_path(self, name: str, batch_id: int) -> str:
        return f"{table_path(self.out, name)}/{BATCH}={batch_id}"


def events_older_than(stored: list[list[int]], since_us: int) -> list[int]:
    """The batches of ``stored`` (batch, newest time read once it was done) with no event from ``since_us``
    on."""
    return [batch for batch, newest in stored if newest < since_us]


def read_table(spark: SparkSession, out: str, name: str) -> DataFrame:
    """A table the follower wrote, all batches together (without the batch column)."""
    return spark.read.parquet(table_path(out, name)).drop(BATCH)
