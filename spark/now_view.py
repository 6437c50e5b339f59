"""The "now" view of a followed event log: the last minutes as of the newest event, rewritten on every
trigger as ``now.json`` and ``now.html`` (a page that reloads itself). Anomalies come first."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any, Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark import anomalies
from spark.latency import latency_stats
from spark.timeline import NO_OUTCOME
from wire import event_schema as ev

WINDOW_S: Final = 300
TOP: Final = 10
# A request with no outcome yet is listed as unanswered once it has waited this long.
IN_FLIGHT_AFTER_S: Final = 10
RELOAD_S: Final = 5


def iso(ts_us: int | None) -> str | None:
    return None if ts_us is None else datetime.fromtimestamp(ts_us / 1e6, UTC).isoformat(timespec="seconds")


def _rows(frame: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [
        {key: round(value, 3) if isinstance(value, float) else value for key, value in row.asDict().items()}
        for row in frame.limit(limit).collect()
    ]


def now_view(
    requests: DataFrame, newest_us: int, rules: anomalies.AnomalyRules, progress: dict[str, Any]
) -> dict[str, Any]:
    """What the view shows, as of ``newest_us`` (the newest event read): the last WINDOW_S seconds."""
    start = newest_us - WINDOW_S * 1_000_000
    answered = requests.where(anomalies.outcome_ts() >= start)
    delivered = answered.where(F.col("end_to_end_us").isNotNull())
    by_dst = latency_stats(delivered, "end_to_end_us", (ev.DST,))
    by_cmd = latency_stats(delivered, "end_to_end_us", (ev.DST, ev.CMD))
    failed = F.col("outcome").isin(ev.FAILED, ev.EXPIRED)
    errors = answered.groupBy(ev.DST).agg(
        F.count(F.lit(1)).alias("requests"),
        F.count(F.when(F.col("outcome") == ev.FAILED, True)).alias("failed"),
        F.count(F.when(F.col("outcome") == ev.EXPIRED, True)).alias("expired"),
        (F.count(F.when(failed, True)) / F.count(F.lit(1))).alias("error_share"),
    )
    waiting = requests.where(
        (F.col("outcome") == NO_OUTCOME) & (F.col("accepted_ts") <= newest_us - IN_FLIGHT_AFTER_S * 1_000_000)
    ).select(
        ev.SRC,
        ev.UID,
        ev.DST,
        ev.CMD,
        "furthest_step",
        ((F.lit(newest_us) - F.col("accepted_ts")) / 1e6).alias("waiting_s"),
    )
    found = anomalies.judge(requests, newest_us, rules)
    return {
        "as_of": iso(newest_us),
        "window_s": WINDOW_S,
        "anomalies": _rows(found.orderBy(F.col("ratio").desc()), 100),
        "slowest_destinations": _rows(by_dst.orderBy(F.col("p99_ms").desc(), ev.DST), TOP),
        "slowest_commands": _rows(by_cmd.orderBy(F.col("p99_ms").desc(), ev.DST, ev.CMD), TOP),
        "errors": _rows(errors.where(F.col("error_share") > 0).orderBy(F.col("error_share").desc()), TOP),
        "unanswered": _rows(waiting.orderBy(F.col("waiting_s").desc()), TOP),
        "unanswered_count": waiting.count(),
        "progress": progress,
    }


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
