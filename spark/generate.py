"""``python -m spark.generate``: synthetic msgbus event logs and backlog snapshots of any size.

    python -m spark.generate --events 10000000 --sites 6 --out /tmp/msgbus-synthetic

writes DIR/events/events-<site>-<chunk>.jsonl (each site's lines in time order within a chunk) and
DIR/backlog/backlog-<site>.jsonl. Chunks are built in parallel worker processes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from spark.synthetic_backlog import snapshot_lines
from spark.synthetic_events import ChunkWriter, Rates, Topology

CHUNK_EVENTS: Final = 500_000
DEFAULT_START: Final = "2026-11-20T00:00:00+00:00"


@dataclass(frozen=True)
class Plan:
    """Everything a worker needs to write one chunk."""

    out: Path
    sites: int
    hosts: int
    start_us: int
    span_us: int
    rates: Rates
    seed: int
    chunk_events: int = CHUNK_EVENTS


def write_chunk(plan: Plan, chunk: int, events: int) -> tuple[int, int]:
    """Write chunk ``chunk`` (``events`` event lines, plus noise) as one file per site; (events, lines)."""
    topology = Topology(plan.sites, plan.hosts, plan.seed)
    writer = ChunkWriter(
        topology, plan.rates, plan.start_us, plan.span_us, seed=plan.seed * 1_000_003 + chunk
    )
    # Request numbers never repeat across chunks: a chunk holds fewer requests than events.
    writer.fill(events, first_number=chunk * plan.chunk_events)
    lines = 0
    for site, site_lines in writer.lines.items():
        if site_lines:
            path = plan.out / "events" / f"events-{site}-{chunk:05d}.jsonl"
            path.write_text("\n".join(site_lines) + "\n", encoding="utf-8")
            lines += len(site_lines)
    return writer.events, lines


def write_backlog(plan: Plan, entries: int) -> int:
    """One snapshot per site, taken at the end of the generated span; lines written."""
    folder = plan.out / "backlog"
    folder.mkdir(parents=True, exist_ok=True)
    taken_at_us = plan.start_us + plan.span_us
    for site in range(1, plan.sites + 1):
        lines = snapshot_lines(site, plan.sites, taken_at_us, entries, seed=plan.seed * 7919 + site)
        (folder / f"backlog-{site}.jsonl").write_text(
            "\n".join(lines) + "\n" if lines else "", encoding="utf-8"
        )
    return entries * plan.sites


def generate(plan: Plan, events: int, backlog_entries: int, workers: int) -> tuple[int, int]:
    """Write ``events`` event lines (plus noise lines) and the snapshots; (event lines, all lines)."""
    (plan.out / "events").mkdir(parents=True, exist_ok=True)
    sizes = [min(plan.chunk_events, events - start) for start in range(0, events, plan.chunk_events)]
    if workers <= 1 or len(sizes) <= 1:
        results = [write_chunk(plan, chunk, size) for chunk, size in enumerate(sizes)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(write_chunk, [plan] * len(sizes), range(len(sizes)), sizes))
    if backlog_entries:
        write_backlog(plan, backlog_entries)
    return sum(result[0] for result in results), sum(result[1] for result in results)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, required=True, help="event lines to write (noise lines come on top)")
    p.add_argument("--sites", type=int, default=4, help="sites (twins 1..S); each sends to the others")
    p.add_argument("--hosts", type=int, default=None, help="machines the sites run on (default: sites // 2)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--start", default=DEFAULT_START, help="ISO 8601 time of the first request")
    p.add_argument("--hours", type=float, default=24.0, help="span the requests are spread over")
    p.add_argument("--backlog-entries", type=int, default=1000, help="entries per site's snapshot (0: none)")
    p.add_argument("--send-failure-rate", type=float, default=Rates.send_failure)
    p.add_argument("--expired-rate", type=float, default=Rates.expired)
    p.add_argument("--unanswered-rate", type=float, default=Rates.unanswered)
    p.add_argument("--duplicate-line-rate", type=float, default=0.0, help="exact copies of lines")
    p.add_argument("--malformed-rate", type=float, default=0.0, help="broken lines, per line")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes building chunks")
    p.add_argument("--chunk-events", type=int, default=CHUNK_EVENTS, help="event lines per file and task")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = datetime.fromisoformat(args.start)
    start = start if start.tzinfo else start.replace(tzinfo=UTC)
    rates = Rates(
        send_failure=args.send_failure_rate,
        expired=args.expired_rate,
        unanswered=args.unanswered_rate,
        duplicate_line=args.duplicate_line_rate,
        malformed_line=args.malformed_rate,
    )
    plan = Plan(
        out=args.out,
        sites=args.sites,
        hosts=args.hosts or max(1, args.sites // 2),
        start_us=int(start.timestamp()) * 1_000_000,
        span_us=int(args.hours * 3600 * 1_000_000),
        rates=rates,
        seed=args.seed,
        chunk_events=args.chunk_events,
    )
    began = time.monotonic()
    events, lines = generate(plan, args.events, args.backlog_entries, args.workers)
    seconds = time.monotonic() - began
    print(
        f"wrote {events:,} events ({lines - events:,} noise lines) and "
        f"{args.backlog_entries * args.sites:,} backlog entries to {args.out} in {seconds:.1f}s "
        f"({events / max(seconds, 1e-9):,.0f} events/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
