"""summary.md and report.html from the job's small results: plain Python data in, text out."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from spark import plots

Row = dict[str, Any]
LATENCY_COLUMNS: Final = ("samples", "p50_ms", "p90_ms", "p99_ms", "max_ms")
HOP_P99_COLUMNS: Final = ("sender_queue_p99_ms", "send_p99_ms", "remote_p99_ms", "reply_path_p99_ms")


@dataclass(frozen=True)
class InputCounts:
    """What was read from one input and what was set aside."""

    lines: int = 0
    kept: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    outside_window: int = 0
    duplicates: int = 0
    unmatched: list[str] = field(default_factory=list)

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows; rows are dicts keyed by the output tables' column names."""

    out: str
    events: InputCounts
    backlog: InputCounts | None  # None: no --backlog given
    first_event_at: datetime | None = None
    last_event_at: datetime | None = None
    sites: list[int] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)  # requests, delivered, failed, expired, unanswered
    end_to_end: Row | None = None  # samples, p50_ms, ... over all requests
    hops: list[Row] = field(default_factory=list)  # hop, samples, p50_ms, ..., cross_host
    slowest: list[Row] = field(default_factory=list)
    # The slowest (src, dst, cmd) by p99 end to end, with each hop's p99; command_count: how many there are.
    by_command: list[Row] = field(default_factory=list)
    command_count: int = 0
    errors: list[Row] = field(default_factory=list)
    delivery: list[Row] = field(default_factory=list)
    latency_by_hour: list[Row] = field(default_factory=list)  # hour, dst, samples, p50_ms, p99_ms
    error_totals: list[Row] = field(default_factory=list)  # cause, events
    throughput: list[Row] = field(default_factory=list)  # period, accepted, delivered, failed, expired
    throughput_period_s: int = 60
    backlog_ages: list[Row] = field(default_factory=list)  # bucket, age_range, kind, entries
    leak_count: int = 0
    leaks: list[Row] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows written


def format_value(value: Any) -> str:
    """How a cell reads: thousands separators, 3 decimals for fractions, ISO times, a dash for null."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def markdown_table(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """A Markdown table of ``columns``; ``_(none)_`` for no rows."""
    if not rows:
        return "_(none)_"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = (format_value(row.get(name)).replace("|", "\\|") for name in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def html_table(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """An HTML table of ``columns``; a short note for no rows."""
    if not rows:
        return "<p><em>(none)</em></p>"
    head = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(format_value(row.get(name)))}</td>" for name in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _input_lines(name: str, counts: InputCounts | None) -> list[str]:
    if counts is None:
        return [f"- {name}: none given"]
    lines = [
        f"- {name}: {counts.lines:,} lines read, {counts.kept:,} kept, {counts.malformed_total:,} malformed, "
        f"{counts.duplicates:,} exact duplicates dropped, {counts.outside_window:,} outside --since/--until"
    ]
    lines += [f"  - malformed, {reason}: {n:,}" for reason, n in sorted(counts.malformed.items())]
    lines += [f"  - no file matches `{pattern}`" for pattern in counts.unmatched]
    return lines


def _sections(data: ReportData) -> list[tuple[str, Sequence[Row], Sequence[str]]]:
    keys = ("src", "dst", "cmd")
    shown = len(data.by_command)
    commands = (
        f"Latency by command, slowest p99 first ({shown:,} of {data.command_count:,}; all of them are in the "
        "latency_end_to_end and latency_hops tables)"
    )
    return [
        (commands, data.by_command, (*keys, *LATENCY_COLUMNS, *HOP_P99_COLUMNS)),
        ("Latency per hop (all requests)", data.hops, ("hop", *LATENCY_COLUMNS, "cross_host")),
        ("Slowest destinations (end to end)", data.slowest, ("rank", "dst", *LATENCY_COLUMNS)),
        (
            "Delivery by destination",
            data.delivery,
            ("src", "dst", "requests", "delivered", "failed", "expired", "unanswered", "retried", "retries"),
        ),
        ("Most frequent errors", data.errors, ("dst", "event", "cause", "events", "per_request")),
        (
            "Backlog entries older than their deadline (most overdue)",
            data.leaks,
            ("site", "kind", *keys[:2], "uid", "queue", "age_s", "overdue_s"),
        ),
    ]


def _overview(data: ReportData) -> list[str]:
    span = (
        f"{format_value(data.first_event_at)} to {format_value(data.last_event_at)} UTC"
        if data.first_event_at
        else "no events"
    )
    outcomes = data.outcomes
    lines = [
        *_input_lines("events", data.events),
        *_input_lines("backlog snapshots", data.backlog),
        f"- time span: {span}; sites: {', '.join(map(str, data.sites)) or '–'}",
        f"- requests accepted: {outcomes.get('requests', 0):,}: delivered {outcomes.get('delivered', 0):,}, "
        f"failed {outcomes.get('failed', 0):,}, expired {outcomes.get('expired', 0):,}, "
        f"no outcome {outcomes.get('unanswered', 0):,}",
    ]
    if data.end_to_end and data.end_to_end.get("samples"):
        e2e = data.end_to_end
        lines.append(
            f"- end to end: p50 {format_value(e2e['p50_ms'])} ms, p90 {format_value(e2e['p90_ms'])} ms, "
            f"p99 {format_value(e2e['p99_ms'])} ms, max {format_value(e2e['max_ms'])} ms"
        )
    if data.backlog is not None:
        lines.append(f"- backlog entries older than their deadline: {data.leak_count:,}")
    return lines


def summary_markdown(data: ReportData) -> str:
    """The summary as Markdown: the counts, the key tables, and where every table was written."""
    parts = ["# msgbus event log mining", "", *_overview(data), ""]
    for title, rows, columns in _sections(data):
        parts += [f"## {title}", "", markdown_table(rows, columns), ""]
    parts += ["## Tables written", ""]
    parts += [f"- `{name}`: {rows:,} rows" for name, rows in data.tables.items()]
    parts.append(f"\nUnder `{data.out}`, as Parquet; the charts are in report.html.")
    return "\n".join(parts) + "\n"


_STYLE: Final = """
body { font-family: sans-serif; margin: 2em; max-width: 75em; }
table { border-collapse: collapse; margin-bottom: 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f0f0f0; }
img { max-width: 100%; }
"""


def report_html(data: ReportData) -> str:
    """One self-contained HTML page: the overview, the charts (embedded PNG) and the key tables."""
    charts = [
        ("Latency over time", plots.latency_over_time(data.latency_by_hour)),
        ("Error causes", plots.error_causes(data.error_totals)),
        ("Throughput", plots.throughput(data.throughput, data.throughput_period_s)),
        ("Backlog ages", plots.backlog_ages(data.backlog_ages)),
    ]
    overview = "".join(f"<li>{html.escape(line.lstrip('- '))}</li>" for line in _overview(data))
    body = [f"<h1>msgbus event log mining</h1><ul>{overview}</ul>"]
    body += [
        f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{png}">'
        for title, png in charts
    ]
    body += [
        f"<h2>{html.escape(title)}</h2>{html_table(rows, columns)}"
        for title, rows, columns in _sections(data)
    ]
    tables = "".join(
        f"<li><code>{html.escape(name)}</code>: {rows:,} rows</li>" for name, rows in data.tables.items()
    )
    body.append(f"<h2>Tables written</h2><ul>{tables}</ul>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>msgbus event log mining</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
