"""The "now" view of a followed event log: the last minutes as of the newest event, rewritten on every
trigger as ``now.json`` and ``now.html`` (a page that reloads itself). Anomalies come first."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark import anomalies
from spark.anomaly_rules import AnomalyRules
from spark.latency import STAT_COLUMNS, stat_aggregates, stat_columns
from spark.timeline import NO_OUTCOME
from spark.times import Time, as_column
from wire import event_schema as ev

WINDOW_S: Final = 300
TOP: Final = 10
# A request with no outcome yet is listed as unanswered once it has waited this long.
IN_FLIGHT_AFTER_S: Final = 10
RELOAD_S: Final = 5


def iso(ts_us: int | None) -> str | None:
    return None if ts_us is None else datetime.fromtimestamp(ts_us / 1e6, UTC).isoformat(timespec="seconds")


def _rows(frame: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [_rounded(row.asDict()) for row in frame.limit(limit).collect()]


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()}


def now_view(
    requests: DataFrame,
    newest_us: int,
    rules: AnomalyRules,
    progress: dict[str, Any],
    newest: Time | None = None,
) -> dict[str, Any]:
    """What the view shows, as of ``newest_us`` (the newest event read): the last WINDOW_S seconds.
    ``newest``: the same time as a column of ``requests`` (:mod:`spark.times`), if it has one.

    Three Spark jobs: the slowest destinations and commands, the errors and the number unanswered come from
    one aggregation (per (dst, cmd), per dst and in all), of which only the rows shown are brought back; the
    longest unanswered; the anomalies."""
    as_of = as_column(newest_us if newest is None else newest)
    answered = anomalies.outcome_ts() >= as_of - WINDOW_S * 1_000_000
    waiting = (F.col("outcome") == NO_OUTCOME) & (
        F.col("accepted_ts") <= as_of - IN_FLIGHT_AFTER_S * 1_000_000
    )
    summary = _summary(requests.where(answered | waiting), answered, waiting)
    shown = summary.where((F.col("_slow_rank") <= TOP) | (F.col("_error_rank") <= TOP) | F.col("_all"))
    per_dst: list[dict[str, Any]] = []
    per_cmd: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    unanswered_count = 0
    for row in shown.collect():
        if row["_all"]:
            unanswered_count = int(row["unanswered"])
            continue
        if row["_slow_rank"] is not None and row["_slow_rank"] <= TOP:
            latency = {key: row[key] for key in (ev.DST, ev.CMD, *STAT_COLUMNS)}
            if row["_per_dst"]:
                del latency[ev.CMD]
            (per_dst if row["_per_dst"] else per_cmd).append(_rounded(latency))
        if row["_error_rank"] is not None and row["_error_rank"] <= TOP:
            errors.append(_rounded({key: row[key] for key in (ev.DST, *ERROR_COLUMNS)}))
    unanswered = requests.where(waiting).select(
        ev.SRC,
        ev.UID,
        ev.DST,
        ev.CMD,
        "furthest_step",
        ((as_of - F.col("accepted_ts")) / 1e6).alias("waiting_s"),
    )
    found = anomalies.judge(requests, as_of, rules)
    return {
        "as_of": iso(newest_us),
        "window_s": WINDOW_S,
        "anomalies": _rows(found.orderBy(F.col("ratio").desc()), 100),
        "slowest_destinations": sorted(per_dst, key=lambda r: (-r["p99_ms"], r[ev.DST])),
        "slowest_commands": sorted(per_cmd, key=lambda r: (-r["p99_ms"], r[ev.DST], r[ev.CMD])),
        "errors": sorted(errors, key=lambda r: (-r["error_share"], r[ev.DST])),
        "unanswered": _rows(unanswered.orderBy(F.col("waiting_s").desc()), TOP),
        "unanswered_count": unanswered_count,
        "progress": progress,
    }


ERROR_COLUMNS: Final = ("requests", "failed", "expired", "error_share")


def _summary(window: DataFrame, answered: Column, waiting: Column) -> DataFrame:
    """Per (dst, cmd), per dst (``_per_dst``) and in all (``_all``): the answered requests' latency end to
    end (STAT_COLUMNS) and errors (ERROR_COLUMNS), and the number unanswered; ``_slow_rank`` and
    ``_error_rank`` rank the rows of each level, slowest and most failing first."""
    end_to_end = F.when(answered, F.col("end_to_end_us"))
    failed = answered & F.col("outcome").isin(ev.FAILED, ev.EXPIRED)
    grouped = window.rollup(ev.DST, ev.CMD).agg(
        F.grouping(ev.DST).cast("boolean").alias("_all"),
        F.grouping(ev.CMD).cast("boolean").alias("_per_dst"),
        *stat_aggregates(end_to_end),
        F.count(F.when(answered, True)).alias("requests"),
        F.count(F.when(answered & (F.col("outcome") == ev.FAILED), True)).alias("failed"),
        F.count(F.when(answered & (F.col("outcome") == ev.EXPIRED), True)).alias("expired"),
        F.try_divide(F.count(F.when(failed, True)), F.count(F.when(answered, True))).alias("error_share"),
        F.count(F.when(waiting, True)).alias("unanswered"),
    )
    stats = grouped.select(
        ev.DST,
        ev.CMD,
        "_all",
        "_per_dst",
        *stat_columns(),
        *ERROR_COLUMNS,
        "unanswered",
    )
    level = Window.partitionBy("_all", "_per_dst")
    slow_rank = F.when(
        ~F.col("_all") & (F.col("samples") > 0),
        F.row_number().over(
            level.orderBy((F.col("samples") > 0).desc(), F.col("p99_ms").desc(), ev.DST, ev.CMD)
        ),
    )
    error_rank = F.when(
        F.col("_per_dst") & ~F.col("_all") & (F.col("error_share") > 0),
        F.row_number().over(level.orderBy(F.col("error_share").desc_nulls_last(), ev.DST)),
    )
    return stats.withColumn("_slow_rank", slow_rank).withColumn("_error_rank", error_rank)


def as_json(view: dict[str, Any]) -> str:
    return json.dumps(view, indent=1, default=str) + "\n"


def _table(title: str, rows: list[dict[str, Any]], empty: str) -> str:
    if not rows:
        return f"<h2>{html.escape(title)}</h2><p>{html.escape(empty)}</p>"
    header = "".join(f"<th>{html.escape(str(key))}</th>" for key in rows[0])
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>" for v in row.values())
        + "</tr>"
        for row in rows
    )
    return f"<h2>{html.escape(title)}</h2><table><tr>{header}</tr>{body}</table>"


def as_html(view: dict[str, Any]) -> str:
    progress = view["progress"]
    sections = [
        _table(
            "Anomalies",
            view["anomalies"],
            "none: every destination is as fast and as reliable as in its last hour",
        ),
        _table("Slowest destinations (p99 end to end)", view["slowest_destinations"], "no request answered"),
        _table("Slowest commands", view["slowest_commands"], "no request answered"),
        _table("Errors", view["errors"], "no request failed or expired"),
        _table(
            f"Unanswered for over {IN_FLIGHT_AFTER_S} s ({view['unanswered_count']})",
            view["unanswered"],
            "none",
        ),
    ]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{RELOAD_S}">
<title>msgbus now</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}h2{{margin-top:1.2em}}</style></head>
<body><h1>msgbus: the last {view["window_s"] // 60} minutes, as of {html.escape(str(view["as_of"]))}</h1>
<p>{html.escape(json.dumps(progress))}</p>
{"".join(sections)}
</body></html>
"""
