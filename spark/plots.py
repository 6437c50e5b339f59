"""The report's charts as base64 PNG, drawn with matplotlib's Agg canvas (no display, no global state)."""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Row = dict[str, Any]
MAX_SERIES: Final = 8  # lines per chart; the busiest destinations are drawn, the rest would be noise
DPI: Final = 100


def _png(figure: Figure) -> str:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(title: str, panels: int = 1) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(9, 3.2 * panels))
    axes = [figure.add_subplot(panels, 1, index + 1) for index in range(panels)]
    axes[0].set_title(title)
    return figure, axes


def _no_data(axes: Axes) -> None:
    axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def latency_over_time(rows: Sequence[Row]) -> str:
    """p50 and p99 end-to-end latency per hour, one line per destination (``hour, dst, samples, p50_ms,
    p99_ms`` rows).
    """
    figure, (p50_axes, p99_axes) = _figure("End-to-end latency per destination", panels=2)
    volume: dict[Any, int] = defaultdict(int)
    for row in rows:
        volume[row["dst"]] += int(row["samples"])
    busiest = sorted(volume, key=lambda dst: -volume[dst])[:MAX_SERIES]
    if not busiest:
        _no_data(p50_axes)
        _no_data(p99_axes)
        return _png(figure)
    for dst in sorted(busiest):
        series = sorted((row for row in rows if row["dst"] == dst), key=lambda row: row["hour"])
        hours = [row["hour"] for row in series]
        p50_axes.plot(hours, [row["p50_ms"] for row in series], marker=".", label=f"dst {dst}")
        p99_axes.plot(hours, [row["p99_ms"] for row in series], marker=".", label=f"dst {dst}")
    p50_axes.set_ylabel("p50 ms")
    p99_axes.set_ylabel("p99 ms (log)")
    # Retried requests put the p99 seconds above the rest.
    p99_axes.set_yscale("log")
    p99_axes.set_xlabel("hour (UTC)")
    p50_axes.legend(fontsize="small", ncol=4)
    figure.autofmt_xdate()
    return _png(figure)


def error_causes(rows: Sequence[Row]) -> str:
    """Error events per cause, most frequent at the top (``cause, events`` rows)."""
    figure, (axes,) = _figure("Error events by cause")
    if not rows:
        _no_data(axes)
        return _png(figure)
    ordered = sorted(rows, key=lambda row: int(row["events"]))
    axes.barh([str(row["cause"])[:60] for row in ordered], [int(row["events"]) for row in ordered])
    axes.set_xlabel("events")
    return _png(figure)


def throughput(rows: Sequence[Row], period_s: int = 60) -> str:
    """Requests accepted and outcomes per period of ``period_s``, all sites together (``period, accepted,
    delivered, failed, expired`` rows).
    """
    minutes = period_s // 60
    per = "per minute" if minutes == 1 else f"per {minutes} minutes"
    figure, (axes,) = _figure(f"Throughput {per}")
    if not rows:
        _no_data(axes)
        return _png(figure)
    ordered = sorted(rows, key=lambda row: row["period"])
    periods = [row["period"] for row in ordered]
    for name in ("accepted", "delivered", "failed", "expired"):
        axes.plot(periods, [int(row[name]) for row in ordered], label=name)
    axes.set_ylabel(per)
    axes.legend(fontsize="small", ncol=4)
    figure.autofmt_xdate()
    return _png(figure)


def backlog_ages(rows: Sequence[Row]) -> str:
    """Pending backlog entries per age range, stacked by kind (``bucket, age_range, kind, entries`` rows)."""
    figure, (axes,) = _figure("Backlog entries by age")
    if not rows:
        _no_data(axes)
        return _png(figure)
    labels = {int(row["bucket"]): str(row["age_range"]) for row in rows}
    buckets = sorted(labels)
    bottom = [0] * len(buckets)
    for kind in sorted({str(row["kind"]) for row in rows}):
        counts = [
            sum(int(row["entries"]) for row in rows if row["kind"] == kind and int(row["bucket"]) == bucket)
            for bucket in buckets
        ]
        axes.bar([labels[bucket] for bucket in buckets], counts, bottom=bottom, label=kind)
        bottom = [total + count for total, count in zip(bottom, counts, strict=True)]
    axes.set_ylabel("entries")
    axes.legend(fontsize="small", ncol=5)
    return _png(figure)
