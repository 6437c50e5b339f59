"""The mining job: read both inputs once, build every table from the persisted rows, write them and the
report. ``run`` takes the session, so tests and ``mine.main`` share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import backlog, failures, latency, throughput, timeline
from spark.ingest import BACKLOG, EVENTS, OUTSIDE_WINDOW, Loaded, Source, load
from spark.outputs import table_path, write_table, write_text
from spark.progress import Progress
from spark.report import InputCounts, ReportData, report_html, summary_markdown
from wire import event_schema as ev

REPORT_ROWS: Final = 15  # rows of each table shown in the report
HOP_NAMES: Final = [hop.removesuffix("_us") for hop in timeline.HOPS]  # in the order a request takes them


@dataclass(frozen=True)
class MineOptions:
    """What to read, where to write, and the time window (microseconds since the epoch, until exclusive)."""

    events: Sequence[str]
    backlog: Sequence[str]
    out: str
    since_us: int | None = None
    until_us: int | None = None


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


def _write(
    progress: Progress, tables: dict[str, int], frame: DataFrame, out: str, name: str, small: bool
) -> None:
    spark = frame.sparkSession
    with progress.stage(f"table {name}") as stage:
        path = write_table(frame, out, name, single_file=small)
        # Parquet footers hold the row count: reading it back costs nothing like recomputing the table.
        tables[name] = spark.read.parquet(path).count()
        stage.detail = f"{tables[name]:,} rows"


def run(spark: SparkSession, options: MineOptions, progress: Progress) -> ReportData:
    """Mine the inputs into Parquet tables, summary.md and report.html under ``options.out``."""
    loaded_events = _read_input(spark, progress, options.events, options, EVENTS)
    loaded_backlog = (
        _read_input(spark, progress, options.backlog, options, BACKLOG) if options.backlog else None
    )
    events = loaded_events.rows
    snapshot = loaded_backlog.rows if loaded_backlog else spark.createDataFrame([], BACKLOG.schema)

    with progress.stage("requests") as stage:
        requests = timeline.request_timeline(events).persist(StorageLevel.MEMORY_AND_DISK)
        stage.detail = f"{requests.count():,} requests"

    out = options.out
    tables: dict[str, int] = {}
    small_tables = {
        "latency_end_to_end": latency.end_to_end_latency(requests),
        "latency_end_to_end_hourly": latency.end_to_end_latency_hourly(requests),
        "latency_hops": latency.hop_latency(requests),
        "slowest_destinations": latency.slowest_destinations(requests),
        "errors": failures.error_causes(events),
        "delivery": failures.delivery_by_destination(requests),
        "throughput_per_minute": throughput.throughput_per_minute(events),
        "backlog_age_histogram": backlog.backlog_age_histogram(snapshot),
        "backlog_leaks": backlog.backlog_leaks(snapshot),
    }
    large_tables = {
        "requests": requests,
        "unanswered": failures.unanswered_requests(requests, events),
    }
    for name, frame in small_tables.items():
        _write(progress, tables, frame, out, name, small=True)
    for name, frame in large_tables.items():
        _write(progress, tables, frame, out, name, small=False)

    with progress.stage("report") as stage:
        data = _report_data(spark, options, loaded_events, loaded_backlog, events, requests, tables)
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
    events: DataFrame,
    requests: DataFrame,
    tables: dict[str, int],
) -> ReportData:
    def table(name: str) -> DataFrame:
        return spark.read.parquet(table_path(options.out, name))

    span = events.agg(F.min(ev.TS).alias("first"), F.max(ev.TS).alias("last")).first()
    sites = sorted(row[ev.SITE] for row in events.select(ev.SITE).distinct().collect())
    delivery = table("delivery")
    outcome_names = ("requests", "delivered", "failed", "expired", "unanswered")
    totals = delivery.agg(*(F.sum(name).alias(name) for name in outcome_names)).first()
    overall = _rows(latency.latency_stats(requests, "end_to_end_us", ()))
    by_hour = latency.latency_stats(latency.with_hour(requests), "end_to_end_us", ("hour", ev.DST))
    minute_totals = (
        table("throughput_per_minute")
        .groupBy("minute")
        .agg(*(F.sum(name).alias(name) for name in ("accepted", "delivered", "failed", "expired")))
    )
    errors = table("errors")
    leaks = table("backlog_leaks")
    ages = (
        table("backlog_age_histogram")
        .groupBy("bucket", "age_range", "kind")
        .agg(F.sum("entries").alias("entries"))
    )
    return ReportData(
        out=options.out,
        events=_counts(loaded_events),
        backlog=_counts(loaded_backlog) if loaded_backlog else None,
        first_event_at=_instant(span["first"] if span else None),
        last_event_at=_instant(span["last"] if span else None),
        sites=sites,
        outcomes={name: int(totals[name] or 0) if totals else 0 for name in outcome_names},
        end_to_end=overall[0] if overall else None,
        hops=sorted(_rows(latency.hop_latency(requests, ())), key=lambda row: HOP_NAMES.index(row["hop"])),
        slowest=_rows(table("slowest_destinations").orderBy("rank"), REPORT_ROWS),
        errors=_rows(errors.orderBy(F.col("events").desc(), "dst", "cause"), REPORT_ROWS),
        delivery=_rows(delivery.orderBy("src", "dst"), REPORT_ROWS * 4),
        latency_by_hour=_rows(by_hour),
        error_totals=_rows(
            errors.groupBy("cause").agg(F.sum("events").alias("events")).orderBy(F.col("events").desc()),
            REPORT_ROWS,
        ),
        throughput=_rows(minute_totals),
        backlog_ages=_rows(ages),
        leak_count=leaks.count(),
        leaks=_rows(leaks.orderBy(F.col("overdue_s").desc()), REPORT_ROWS),
        tables=tables,
    )


def _instant(ts_us: int | None) -> datetime | None:
    return datetime.fromtimestamp(ts_us / 1_000_000, tz=UTC) if ts_us is not None else None
