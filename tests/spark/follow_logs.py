"""Event log files written as daemons write them, with times chosen so that minutes close on cue, for the
tests of ``msgbus mine --follow``; and the batch job's per-minute tables over the same files."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import minutes
from spark.ingest import EVENTS, load
from spark.timeline import request_timeline
from tests.spark.frames import T0, event, round_trip
from wire import event_schema as ev

MINUTE = 60_000_000
START = T0 - T0 % MINUTE  # a minute's start
WATERMARK_S = 60.0
SLOW_FROM_MIN = 15
FAST, SLOW = 2, 3


def request(at: int, uid: str, dst: int, extra_us: int = 0) -> list[dict[str, Any]]:
    """One answered request to ``dst``; ``extra_us`` more in its service."""
    events = round_trip(at, uid=uid, dst=dst)
    return [e if e[ev.TS] < at + 4000 else {**e, ev.TS: e[ev.TS] + extra_us} for e in events]


def traffic(first_min: int, end_min: int) -> list[dict[str, Any]]:
    """Six requests a minute to each destination; SLOW's take 100 ms more from SLOW_FROM_MIN on; one request
    to SLOW a minute fails, one in ten minutes expires."""
    events: list[dict[str, Any]] = []
    for minute in range(first_min, end_min):
        for n in range(6):
            at = START + minute * MINUTE + n * 10_000_000
            events += request(at, f"{FAST}.{minute}{n}", FAST)
            extra = 100_000 if minute >= SLOW_FROM_MIN else 0
            events += request(at + 1000, f"{SLOW}.{minute}{n}", SLOW, extra)
        failing = {ev.UID: f"{SLOW}.{minute}f", ev.CMD: "calc.add", ev.SRC: 1, ev.DST: SLOW, ev.HOST: "h1"}
        at = START + minute * MINUTE + 5_000_000
        events += [
            event(at, 1, ev.ACCEPTED, **failing),
            event(at + 100, 1, ev.SEND_FAILED, attempt=1, error="connection refused", **failing),
            event(at + 200, 1, ev.FAILED, error="all retries done: connection refused", **failing),
        ]
        if minute % 10 == 3:
            lost = {**failing, ev.UID: f"{SLOW}.{minute}x"}
            events += [event(at + 300, 1, ev.ACCEPTED, **lost), event(at + 30_000_000, 1, ev.EXPIRED, **lost)]
    return events


def write_log(
    folder: Path, name: str, events: list[dict[str, Any]], extra_lines: tuple[str, ...] = ()
) -> None:
    """As daemons do: each site's events in a file of its own, named once complete."""
    for site in sorted({e[ev.SITE] for e in events}):
        lines = [json.dumps(e) for e in sorted(events, key=lambda e: e[ev.TS]) if e[ev.SITE] == site]
        text = "\n".join([*lines, *(extra_lines if site == 1 else ())]) + "\n"
        (folder / f"events-{site}-{name}.jsonl.writing").write_text(text)
        (folder / f"events-{site}-{name}.jsonl.writing").rename(folder / f"events-{site}-{name}.jsonl")


def closed_until(now: dict[str, Any]) -> int:
    at = datetime.fromisoformat(now["progress"]["closed_until"])
    return int(at.timestamp()) * 1_000_000


def batch_tables(spark: SparkSession, logs: Path, before_us: int) -> dict[str, DataFrame]:
    """The per-minute tables the batch job computes over ``logs`` (its own reading of the files and the
    functions ``spark.job.run`` writes them with), for the minutes before ``before_us``."""
    loaded = load(spark, [str(logs / "*.jsonl")], EVENTS, None, None)
    tables = minutes.per_minute_tables(loaded.rows, request_timeline(loaded.rows))
    before = F.col(minutes.MINUTE) < F.timestamp_micros(F.lit(before_us))
    return {name: frame.where(before) for name, frame in tables.items()}
