"""Hand-made event and backlog rows for the Spark tests."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark.schema import backlog_schema, event_schema
from wire import event_schema as ev

T0 = 1_795_300_000_000_000  # 2026-11-21 22:26:40 UTC, microseconds


def event(ts: int, site: int, name: str, **fields: Any) -> dict[str, Any]:
    """One event line; ``fields`` are other event fields (checked against the schema)."""
    unknown = set(fields) - set(ev.EVENT_FIELDS)
    assert not unknown, f"not event fields: {unknown}"
    return {ev.TS: ts, ev.SITE: site, ev.EVENT: name, **fields}


def events_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    schema = event_schema()
    return spark.createDataFrame([tuple(row.get(name) for name in schema.names) for row in rows], schema)


def backlog_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    schema = backlog_schema()
    unknown = {name for row in rows for name in row} - set(schema.names)
    assert not unknown, f"not backlog fields: {unknown}"
    return spark.createDataFrame([tuple(row.get(name) for name in schema.names) for row in rows], schema)


def round_trip(
    t0: int = T0,
    uid: str = "2.7",
    src: int = 1,
    dst: int = 2,
    cmd: str = "calc.add",
    src_host: str = "h1",
    dst_host: str = "h1",
) -> list[dict[str, Any]]:
    """The eight events of one answered request, as in docs/mining.md: sender queue 1.2 ms, send 0.9 ms,
    remote 2.5 ms, reply path 1.3 ms, end to end 5.4 ms.
    """
    key = {ev.UID: uid, ev.CMD: cmd, ev.SRC: src, ev.DST: dst}
    at_src = {ev.HOST: src_host, **key}
    at_dst = {ev.HOST: dst_host, **key}
    return [
        event(t0, src, ev.ACCEPTED, ret="6f1c", bytes=64, **at_src),
        event(t0 + 1200, src, ev.SENT, attempt=1, status=200, duration_us=900, **at_src),
        event(t0 + 1500, dst, ev.RECEIVED, bytes=64, **at_dst),
        event(t0 + 1600, dst, ev.HANDED_TO_SERVICE, queue=f"msgbus.{cmd}", **at_dst),
        event(t0 + 4000, dst, ev.REPLY_TAKEN, **at_dst),
        event(t0 + 5000, dst, ev.REPLY_SENT, attempt=1, status=200, duration_us=800, **at_dst),
        event(t0 + 5300, src, ev.REPLY_RECEIVED, **at_src),
        event(t0 + 5400, src, ev.DELIVERED, ret="6f1c", **at_src),
    ]
