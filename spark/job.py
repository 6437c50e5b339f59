"""The mining job: read both inputs once, build every table from the persisted rows, write them and the
report. ``run`` takes the session, so tests and ``mine.main`` share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import backlog, failures, latency, minutes, throughput, timeline
from spark.ingest import BACKLOG, EVENTS, OUTSIDE_WINDOW, PERSISTED, Loaded, Source, load, resolve_paths
from spark.outputs import table_path, write_table, write_text
from spark.partitioning import SHUFFLE_PARTITIONS, choose_shuffle_partitions
from spark.progress import Progress
from spark.report import InputCounts, ReportData, report_html, summary_markdown
from wire import event_schema as ev

REPORT_ROWS: Final = 15  # rows of each table shown in the report
REPORT_QUERIES_AT_ONCE: Final = 4
TABLES_AT_ONCE: Final = 3
HOP_NAMES: Final = [hop.removesuffix("_us") for hop in timeline.HOPS]  # in the order a request takes them


@dataclass(frozen=True)
class MineOptions:
    """What to read, where to write, and the time window (microseconds since the epoch, until exclusive)."""

    events: Sequence[str]
    backlog: Sequence[str]
    out: str
    since_us: int | None = None
    until_us: int | None = None
    # None: chosen from the cores and the input's size (spark.partitioning), unless the session has it set.
    shuffle_partitions: int | None = None


def _counts(loaded: Loaded) -> InputCounts:
    return InputCounts(
        lines=loaded.lines,
        kept=loaded.kept,
        malformed=loaded.malformed,
        outside_window=loaded.set_aside.get(OUTSIDE_WINDOW, 0),
        duplicates=loaded.duplicates,
        unmatched=list(loaded.unmatched),
    )


def _utc(value: Any) -> Any:
    # PySpark hands timestamps back as naive datetimes in this process's local time zone.
    return value.astimezone(UTC) if isinstance(value, datetime) and value.tzinfo is None else value


def _rows(frame: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    rows = (frame.limit(limit) if limit is not None else frame).collect()
    return [{name: _utc(value) for name, value in row.asDict().items()} for row in rows]


def _read_input(
    spark: SparkSession, progress: Progress, patterns: Sequence[str], options: MineOptions, source: Source
) -> Loaded:
    with progress.stage(f"read {source.name}") as stage:
        loaded = load(spark, patterns, source, options.since_us, options.until_us)
        malformed = sum(loaded.malformed.values())
        stage.detail = (
            f"{loaded.lines:,} lines, {loaded.kept:,} kept, {malformed:,} malformed, "
            f"{loaded.duplicates:,} duplicates"
        )
    for pattern in loaded.unmatched:
        progress.note(f"warning: no file matches {pattern}")
    for reason, lines in sorted(loaded.malformed.items()):
        progress.note(f"warning: {lines:,} malformed {source.name} lines skipped ({reason})")
    return loaded


def _write(progress: Progress, out: str, name: str, frame: DataFrame, small: bool) -> int:
    with progress.stage(f"table {name}") as stage:
        rows = write_table(frame, out, name, single_file=small)
        stage.detail = f"{rows:,} rows"
    return rows


def run(spark: SparkSession, options: MineOptions, progress: Progress) -> ReportData:
    """Mine the inputs into Parquet tables, summary.md and report.html under ``options.out``."""
    with progress.stage("plan") as stage:
        if options.shuffle_partitions is not None:
            spark.conf.set(SHUFFLE_PARTITIONS, str(options.shuffle_partitions))
            partitions = options.shuffle_partitions
        else:
            partitions = choose_shuffle_partitions(
                spark, resolve_paths([*options.events, *options.backlog])[0]
            )
        stage.detail = f"{partitions} shuffle partitions"
    loaded_events = _read_input(spark, progress, options.events, options, EVENTS)
    loaded_backlog = (
        _read_input(spark, progress, options.backlog, options, BACKLOG) if options.backlog else None
    )
    events = loaded_events.rows
    snapshot = loaded_backlog.rows if loaded_backlog else spark.createDataFrame([], BACKLOG.schema)

    with progress.stage("requests") as stage:
        requests = timeline.request_timeline(events).persist(PERSISTED)
        stage.detail = f"{requests.count():,} requests"

    out = options.out
    small_tables = {
        "latency_end_to_end": latency.end_to_end_latency(requests),
        "latency_end_to_end_hourly": latency.end_to_end_latency_hourly(requests),
        "latency_hops": latency.hop_latency(requests),
        "slowest_destinations": latency.slowest_destinations(requests),
        "errors": failures.error_causes(events),
        "delivery": failures.delivery_by_destination(requests),
        "throughput_per_minute": throughput.throughput_per_minute(events),
        minutes.LATENCY: minutes.latency_per_minute(requests),
        minutes.ERRORS: minutes.errors_per_minute(events),
        "backlog_age_histogram": backlog.backlog_age_histogram(snapshot),
        "backlog_leaks": backlog.backlog_leaks(snapshot),
    }
    large_tables = {
        "requests": requests,
        "unanswered": failures.unanswered_requests(requests, events),
        minutes.UNANSWERED: minutes.unanswered_per_minute(requests),
    }
    writes = [(name, frame, True) for name, frame in small_tables.items()]
    writes += [(name, frame, False) for name, frame in large_tables.items()]
    # Each table is a few small jobs: written side by side, they keep the cores busy between them.
    with ThreadPoolExecutor(max_workers=TABLES_AT_ONCE) as pool:
        counts = pool.map(lambda write: _write(progress, out, *write), writes)
        tables = {name: rows for (name, _, _), rows in zip(writes, counts, strict=True)}

    with progress.stage("report") as stage:
        data = _report_data(spark, options, loaded_events, loaded_backlog, requests, small_tables, tables)
        write_text(spark, out, "summary.md", summary_markdown(data))
        write_text(spark, out, "report.html", report_html(data))
        stage.detail = f"{table_path(out, 'report.html')}, {table_path(out, 'summary.md')}"

    requests.unpersist()
    loaded_events.release()
    if loaded_backlog:
        loaded_backlog.release()
    return data


def _report_data(
    spark: SparkSession,
    options: MineOptions,
    loaded_events: Loaded,
    loaded_backlog: Loaded | None,
    requests: DataFrame,
    written: dict[str, DataFrame],
    tables: dict[str, int],
) -> ReportData:
    def table(name: str) -> DataFrame:
        # With the schema given, Spark reads the small table without a job to infer it.
        return spark.read.schema(written[name].schema).parquet(table_path(options.out, name))

    first_ts, last_ts = loaded_events.first_us, loaded_events.last_us
    delivery = table("delivery")
    outcome_names = ("requests", "delivered", "failed", "expired", "unanswered")
    by_hour = latency.latency_stats(latency.with_hour(requests), "end_to_end_us", ("hour", ev.DST))
    period_s = throughput.chart_period_s(first_ts, last_ts)
    per_period = throughput.outcomes_per_period(table("throughput_per_minute"), period_s)
    # The p99 of each hop per command, a column per hop (PySpark's stubs type pivot values this way).
    hop_columns: list[bool | float | int | str] = [*HOP_NAMES]
    hop_p99 = (
        table("latency_hops")
        .groupBy(ev.SRC, ev.DST, ev.CMD)
        .pivot("hop", hop_columns)
        .agg(F.first("p99_ms"))
        .select(ev.SRC, ev.DST, ev.CMD, *(F.col(hop).alias(f"{hop}_p99_ms") for hop in HOP_NAMES))
    )
    by_command = (
        table("latency_end_to_end")
        .join(hop_p99, [ev.SRC, ev.DST, ev.CMD], "left")
        .orderBy(F.col("p99_ms").desc_nulls_last(), ev.SRC, ev.DST, ev.CMD)
    )
    errors = table("errors")
    ages = (
        table("backlog_age_histogram")
        .groupBy("bucket", "age_range", "kind")
        .agg(F.sum("entries").alias("entries"))
    )
    queries: dict[str, tuple[DataFrame, int | None]] = {
        "totals": (delivery.agg(*(F.sum(name).alias(name) for name in outcome_names)), None),
        "overall": (latency.hop_latency(requests, (), with_end_to_end=True), None),
        "slowest": (table("slowest_destinations").orderBy("rank"), REPORT_ROWS),
        "by_command": (by_command, 2 * REPORT_ROWS),
        "errors": (errors.orderBy(F.col("events").desc(), "dst", "cause"), REPORT_ROWS),
        "delivery": (delivery.orderBy("src", "dst"), REPORT_ROWS * 4),
        "latency_by_hour": (by_hour, None),
        "error_totals": (
            errors.groupBy("cause").agg(F.sum("events").alias("events")).orderBy(F.col("events").desc()),
            REPORT_ROWS,
        ),
        "throughput": (per_period, None),
        "backlog_ages": (ages, None),
        "leaks": (table("backlog_leaks").orderBy(F.col("overdue_s").desc()), REPORT_ROWS),
    }
    # Small queries: run together, they wait for the executors once rather than one after the other.
    with ThreadPoolExecutor(max_workers=REPORT_QUERIES_AT_ONCE) as pool:
        rows = dict(zip(queries, pool.map(lambda query: _rows(*query), queries.values()), strict=True))
    totals = rows["totals"][0] if rows["totals"] else {}
    end_to_end = next((row for row in rows["overall"] if row["hop"] == "end_to_end"), None)
    return ReportData(
        out=options.out,
        events=_counts(loaded_events),
        backlog=_counts(loaded_backlog) if loaded_backlog else None,
        first_event_at=_instant(first_ts),
        last_event_at=_instant(last_ts),
        sites=loaded_events.sites,
        outcomes={name: int(totals.get(name) or 0) for name in outcome_names},
        end_to_end=end_to_end,
        hops=sorted(
            (row for row in rows["overall"] if row is not end_to_end),
            key=lambda row: HOP_NAMES.index(row["hop"]),
        ),
        slowest=rows["slowest"],
        by_command=rows["by_command"],
        command_count=tables["latency_end_to_end"],
        errors=rows["errors"],
        delivery=rows["delivery"],
        latency_by_hour=rows["latency_by_hour"],
        error_totals=rows["error_totals"],
        throughput=rows["throughput"],
        throughput_period_s=period_s,
        backlog_ages=rows["backlog_ages"],
        leak_count=tables["backlog_leaks"],
        leaks=rows["leaks"],
        tables=tables,
    )


def _instant(ts_us: int | None) -> datetime | None:
    return datetime.fromtimestamp(ts_us / 1_000_000, tz=UTC) if ts_us is not None else None
