"""Latency across a WAN: two sites on two hosts of the network test bed with a delay between them, msgbus's
pair and go-rmb's pair (``--peer-bin``) on the same hosts, measured in the same run, taking turns.

For each one-way delay D (``--delays``, milliseconds; 0 is the baseline, the bed without delay) the router
holds every packet D ms, so a network round trip between the hosts takes 2*D. At each delay, for each
system: (a) one caller back to back (p50, p90), (b) one caller sending a request every ``--every`` seconds
(``--paced`` of them; the two systems' requests interleaved half a period apart), (c) one lone request after
``--idle`` seconds without traffic (both systems idle at once, then one request each), (d) ``--rate``
requests a second in open loop (``bench.rpc``'s, for ``--duration`` seconds), (e) ``--callers`` callers back
to back: RPC/s (:func:`bench.rpc.measure`). The callers and the echo service
(``bench.echo_service``) run in the root namespace on the sites' Redis sockets, as in ``bench.rpc``.

The floor is the network: an RMB round trip crosses it twice (the request, the reply), one network round
trip. The target: msgbus's p50 at most 1.2 network round trips plus its p50 without delay (back to back),
in every case.

    python -m bench.wan [--delays 0,50,200] [--idle 60] [--peer-bin GO_RMB] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.bed_sites import (
    CALLEE_TWIN,
    Pair,
    go_rmb_pair,
    keep_logs,
    msgbus_pair,
    network_rtt_ms,
    service,
    two_hosts,
)
from bench.rpc import CMD, Load, OpenLoad, measure
from testing.netbed import Host, NetBed, require_netbed
from wire import keys
from wire.envelope import Envelope, encode_payload

PEER = "go-rmb"
OURS = "msgbus"
# Within this many network round trips of the loopback p50: the target.
TARGET_RTTS = 1.2
REQUEST_TIMEOUT_S = 30.0
EXP_S = 60
CASES = ("back to back", "paced", "open loop", "after idle")


@dataclass(frozen=True)
class Settings:
    """What one run measures; the defaults take about seven minutes with go-rmb."""

    delays_ms: tuple[float, ...] = (0.0, 50.0, 200.0)
    warmup_s: float = 2.0
    # Back to back: measured at least this long, and until this many requests were answered.
    duration_s: float = 8.0
    min_requests: int = 15
    paced: int = 15
    every_s: float = 2.0
    # Open loop: requests a second (0: none).
    rate_per_s: float = 50.0
    # 0: no lone request after an idle time.
    idle_s: float = 60.0
    callers: int = 64
    crowd_duration_s: float = 6.0
    payload_bytes: int = 64
    workers: int = 16
    key_type: str = "ed25519"
    # More msgbusd flags, e.g. ("--link-idle", "10").
    daemon_args: tuple[str, ...] = ()
    peer_bin: str | None = None
    logs_dir: Path | None = None


@dataclass
class Latencies:
    """Seconds from push to reply of the answered requests of one case, and how many got no reply."""

    seconds: list[float] = field(default_factory=list)
    lost: int = 0

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.seconds)

        def at(share: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 2)

        return {
            "count": len(ordered),
            "p50_ms": at(0.5),
            "p90_ms": at(0.9),
            "max_ms": at(1.0),
            "lost": self.lost,
        }


@dataclass
class Row:
    """One system at one delay."""

    system: str
    delay_ms: float
    rtt_ms: float
    rtt_measured_ms: float
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    crowd: dict[str, Any] = field(default_factory=dict)

    def p50(self, case: str) -> float | None:
        found = self.cases.get(case)
        return None if found is None else found["p50_ms"]


def request(payload: bytes) -> tuple[str, bytes]:
    """A request for the echo service at twin 2, as ``bench.rpc``'s callers make it: its return queue, and
    the envelope to push."""
    ret = str(uuid.uuid4())
    envelope = Envelope(
        cmd=CMD, dst=(CALLEE_TWIN,), ret=ret, dat=encode_payload(payload), exp=EXP_S, now=int(time.time())
    )
    return ret, envelope.encode()


async def one_request(
    conn: aioredis.Redis, payload: bytes, timeout_s: float = REQUEST_TIMEOUT_S
) -> float | None:
    """Seconds from pushing one request to its reply; None if none came within ``timeout_s``."""
    ret, raw = request(payload)
    started = time.perf_counter()
    await conn.rpush(keys.LOCAL, raw)
    deadline = started + timeout_s
    while (left := deadline - time.perf_counter()) > 0:
        if await conn.blpop([ret], timeout=min(1.0, max(0.01, left))) is not None:
            return time.perf_counter() - started
    return None


async def back_to_back(redis_url: str, settings: Settings) -> Latencies:
    """One caller (``bench.rpc``'s), its requests one after another: measured after the warm-up, for at
    least ``duration_s`` and ``min_requests`` answers."""
    load = Load(clients=1, payload=b"x" * settings.payload_bytes, timeout_s=REQUEST_TIMEOUT_S)
    stop = asyncio.Event()
    caller = asyncio.create_task(load.caller(redis_url, stop))
    try:
        await asyncio.sleep(settings.warmup_s)
        load.measuring = True
        started = time.perf_counter()
        while (
            time.perf_counter() - started < settings.duration_s or len(load.latencies) < settings.min_requests
        ):
            if caller.done():
                break
            await asyncio.sleep(0.02)
        load.measuring = False
    finally:
        stop.set()
        await caller
    return Latencies(list(load.latencies), load.lost)


async def paced(pairs: Sequence[Pair], settings: Settings) -> dict[str, Latencies]:
    """``settings.paced`` requests per system, one every ``every_s``, the systems' schedules interleaved
    (system k starts ``k * every_s / len(pairs)`` later)."""
    payload = b"x" * settings.payload_bytes
    start = time.perf_counter() + 0.1

    async def one_system(pair: Pair, offset_s: float) -> Latencies:
        found = Latencies()
        conn = aioredis.Redis.from_url(pair.redis_urls[0])
        try:
            for number in range(settings.paced):
                await asyncio.sleep(
                    max(0.0, start + offset_s + number * settings.every_s - time.perf_counter())
                )
                took = await one_request(conn, payload)
                if took is None:
                    found.lost += 1
                else:
                    found.seconds.append(took)
        finally:
            await conn.aclose()
        return found

    gap_s = settings.every_s / len(pairs)
    results = await asyncio.gather(*(one_system(pair, index * gap_s) for index, pair in enumerate(pairs)))
    return {pair.system: found for pair, found in zip(pairs, results, strict=True)}


async def after_idle(pairs: Sequence[Pair], settings: Settings) -> dict[str, Latencies]:
    """Nothing sent for ``idle_s``; then one request to each system, one after the other."""
    await asyncio.sleep(settings.idle_s)
    found = {}
    for pair in pairs:
        conn = aioredis.Redis.from_url(pair.redis_urls[0])
        try:
            took = await one_request(conn, b"x" * settings.payload_bytes)
        finally:
            await conn.aclose()
        found[pair.system] = Latencies([] if took is None else [took], int(took is None))
    return found


async def open_loop(pair: Pair, services: dict[str, int], settings: Settings) -> Latencies:
    """``bench.rpc``'s open loop: a request every 1/R s for ``duration_s`` after the warm-up."""
    load = OpenLoad(settings.rate_per_s, b"x" * settings.payload_bytes, timeout_s=REQUEST_TIMEOUT_S)
    pids = {**pair.pids, "service": services[pair.system]}
    await measure(pair.redis_urls, pids, load, settings.warmup_s, settings.duration_s)
    return Latencies(load.latencies, load.lost)


async def at_one_delay(
    pairs: Sequence[Pair], services: dict[str, int], settings: Settings, rows: dict[str, Row]
) -> None:
    """Every case at the delay the bed has now, for every pair, in the order of ``pairs``."""
    for pair in pairs:
        rows[pair.system].cases["back to back"] = (await back_to_back(pair.redis_urls[0], settings)).summary()
        _progress(rows[pair.system], "back to back")
    for system, found in (await paced(pairs, settings)).items():
        rows[system].cases["paced"] = found.summary()
        _progress(rows[system], "paced")
    if settings.rate_per_s > 0:
        for pair in pairs:
            rows[pair.system].cases["open loop"] = (await open_loop(pair, services, settings)).summary()
            _progress(rows[pair.system], "open loop")
    for pair in pairs:
        load = Load(clients=settings.callers, payload=b"x" * settings.payload_bytes)
        pids = {**pair.pids, "service": services[pair.system]}
        crowd = await measure(pair.redis_urls, pids, load, settings.warmup_s, settings.crowd_duration_s)
        rows[pair.system].crowd = {key: crowd[key] for key in ("rpc_per_s", "p50_ms", "p99_ms", "lost")}
        rows[pair.system].crowd["daemon_cpu_ms_per_rpc"] = crowd["daemon_cpu_ms_per_rpc"]
        _progress(rows[pair.system], "crowd")
    if settings.idle_s > 0:
        for system, found in (await after_idle(pairs, settings)).items():
            rows[system].cases["after idle"] = found.summary()
            _progress(rows[system], "after idle")


def _progress(row: Row, case: str) -> None:
    figures = row.crowd if case == "crowd" else row.cases[case]
    print(json.dumps({"system": row.system, "delay_ms": row.delay_ms, "case": case, **figures}), flush=True)


def run(settings: Settings) -> list[Row]:
    """Start the bed, the sites and the services; measure every delay; return a row per system and delay."""
    rows: list[Row] = []
    with two_hosts() as (bed, caller, callee), contextlib.ExitStack() as stack:
        daemon_args = ["--log-level", "info", *settings.daemon_args]
        pairs = [stack.enter_context(msgbus_pair(caller, callee, daemon_args, settings.key_type))]
        if settings.peer_bin:
            pairs.append(stack.enter_context(go_rmb_pair(settings.peer_bin, caller, callee)))
        try:
            services = {
                pair.system: stack.enter_context(
                    service("bench.echo_service", pair.redis_urls[1], CMD, str(settings.workers))
                ).pid
                for pair in pairs
            }
            for index, delay_ms in enumerate(settings.delays_ms):
                rows += _at_delay(
                    bed, caller, callee, pairs[:: 1 if index % 2 == 0 else -1], services, settings, delay_ms
                )
        finally:
            for pair in pairs:
                keep_logs(pair, settings.logs_dir, "wan")
    return rows


def _at_delay(
    bed: NetBed,
    caller: Host,
    callee: Host,
    pairs: Sequence[Pair],
    services: dict[str, int],
    settings: Settings,
    delay_ms: float,
) -> list[Row]:
    with bed.delay(delay_ms):
        measured = network_rtt_ms(caller, callee)
        found = {pair.system: Row(pair.system, delay_ms, 2 * delay_ms, measured) for pair in pairs}
        asyncio.run(at_one_delay(pairs, services, settings, found))
    return sorted(found.values(), key=lambda row: row.system != OURS)


# --- the tables -------------------------------------------------------------------------------------------


def _find(rows: Sequence[Row], system: str, delay_ms: float) -> Row | None:
    return next((row for row in rows if row.system == system and row.delay_ms == delay_ms), None)


def in_rtts(rows: Sequence[Row], row: Row, case: str) -> float | None:
    """``row``'s p50 in ``case`` less its system's back-to-back p50 without delay, in network round trips
    (None without a delay, or without a baseline in the run)."""
    base = _find(rows, row.system, 0.0)
    p50 = row.p50(case)
    if row.rtt_ms <= 0 or base is None or p50 is None or base.p50("back to back") is None:
        return None
    return round((p50 - base.p50("back to back")) / row.rtt_ms, 2)  # type: ignore[operator]


def target_ms(rows: Sequence[Row], delay_ms: float) -> float | None:
    """The most msgbus's p50 may be at ``delay_ms``: 1.2 network round trips plus its loopback p50."""
    base = _find(rows, OURS, 0.0)
    if base is None or base.p50("back to back") is None:
        return None
    return round(TARGET_RTTS * 2 * delay_ms + base.p50("back to back"), 2)  # type: ignore[operator]


def _cell(value: object) -> str:
    return "–" if value is None else str(value)


def latency_table(rows: Sequence[Row], settings: Settings) -> str:
    """One line per delay and case: each system's p50 (p90), in round trips over the loopback p50, and the
    target."""
    names = {
        "back to back": "back to back",
        "paced": f"one every {settings.every_s:g} s",
        "open loop": f"{settings.rate_per_s:g} a second, open loop",
        "after idle": f"after {settings.idle_s:g} s idle",
    }
    lines = [
        "| one-way delay | network RTT (measured) | case | msgbus p50 (p90) ms | go-rmb p50 (p90) ms "
        "| msgbus RTTs over loopback | go-rmb RTTs over loopback | target: msgbus p50 <= | met "
        "| lost msgbus / go-rmb |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for delay_ms in settings.delays_ms:
        ours, peer = _find(rows, OURS, delay_ms), _find(rows, PEER, delay_ms)
        if ours is None:
            continue
        limit = target_ms(rows, delay_ms) if delay_ms > 0 else None
        for case in CASES:
            if case not in ours.cases:
                continue
            mine = ours.cases[case]
            theirs = peer.cases.get(case) if peer is not None else None
            met = (
                "–"
                if limit is None or mine["p50_ms"] is None
                else ("yes" if mine["p50_ms"] <= limit else "no")
            )
            lost = f"{mine['lost']} / {_cell(theirs['lost'] if theirs else None)}"
            lines.append(
                f"| {delay_ms:g} ms | {ours.rtt_ms:g} ms ({ours.rtt_measured_ms:g}) | {names[case]} "
                f"| {_p50_p90(mine)} | {_p50_p90(theirs)} | {_cell(in_rtts(rows, ours, case))} "
                f"| {_cell(in_rtts(rows, peer, case) if peer else None)} | {_cell(limit)} | {met} | {lost} |"
            )
    return "\n".join(lines)


def _p50_p90(figures: dict[str, Any] | None) -> str:
    if figures is None or figures["p50_ms"] is None:
        return "–"
    if figures["count"] <= 1:
        return str(figures["p50_ms"])
    return f"{figures['p50_ms']} ({figures['p90_ms']})"


def crowd_table(rows: Sequence[Row], settings: Settings) -> str:
    """One line per delay: RPC/s, p50 and p99 at ``settings.callers`` callers, each system."""
    lines = [
        f"| one-way delay | network RTT | msgbus RPC/s at {settings.callers} | p50 / p99 ms | go-rmb RPC/s "
        "| p50 / p99 ms | msgbus / go-rmb | daemon CPU ms/RPC msgbus / go-rmb | lost msgbus / go-rmb |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for delay_ms in settings.delays_ms:
        ours, peer = _find(rows, OURS, delay_ms), _find(rows, PEER, delay_ms)
        if ours is None:
            continue
        mine, theirs = ours.crowd, peer.crowd if peer is not None else {}
        ratio = f"{mine['rpc_per_s'] / theirs['rpc_per_s']:.2f}x" if theirs.get("rpc_per_s") else None
        cells = [
            f"{delay_ms:g} ms",
            f"{ours.rtt_ms:g} ms",
            mine["rpc_per_s"],
            f"{mine['p50_ms']} / {mine['p99_ms']}",
            theirs.get("rpc_per_s"),
            f"{_cell(theirs.get('p50_ms'))} / {_cell(theirs.get('p99_ms'))}",
            ratio,
            f"{mine['daemon_cpu_ms_per_rpc']} / {_cell(theirs.get('daemon_cpu_ms_per_rpc'))}",
            f"{mine['lost']} / {_cell(theirs.get('lost'))}",
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = Settings()
    parser.add_argument(
        "--delays", default="0,50,200", help="one-way delays in ms, comma-separated (0: none)"
    )
    parser.add_argument("--warmup", type=float, default=defaults.warmup_s, help="seconds before measuring")
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="back to back: seconds")
    parser.add_argument(
        "--min-requests", type=int, default=defaults.min_requests, help="back to back: at least"
    )
    parser.add_argument("--paced", type=int, default=defaults.paced, help="requests one --every seconds")
    parser.add_argument(
        "--every", type=float, default=defaults.every_s, help="seconds between paced requests"
    )
    parser.add_argument(
        "--rate", type=float, default=defaults.rate_per_s, help="open loop: requests a second (0: none)"
    )
    parser.add_argument(
        "--idle", type=float, default=defaults.idle_s, help="seconds idle before a lone request (0: none)"
    )
    parser.add_argument("--callers", type=int, default=defaults.callers, help="concurrent callers for RPC/s")
    parser.add_argument(
        "--crowd-duration", type=float, default=defaults.crowd_duration_s, help="their seconds"
    )
    parser.add_argument("--workers", type=int, default=defaults.workers, help="echo service workers")
    parser.add_argument("--key-type", default=defaults.key_type)
    parser.add_argument("--daemon-arg", action="append", default=[], help="extra msgbusd flag (repeatable)")
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also measure two go-rmb daemons of this build")
    parser.add_argument("--logs", type=Path, help="copy the daemons' logs into this directory")
    parser.add_argument("--json", action="store_true", help="end with every row as one JSON line")
    args = parser.parse_args(argv)
    settings = Settings(
        delays_ms=tuple(float(delay) for delay in args.delays.split(",")),
        warmup_s=args.warmup,
        duration_s=args.duration,
        min_requests=args.min_requests,
        paced=args.paced,
        every_s=args.every,
        rate_per_s=args.rate,
        idle_s=args.idle,
        callers=args.callers,
        crowd_duration_s=args.crowd_duration,
        workers=args.workers,
        key_type=args.key_type,
        peer_bin=args.peer_bin,
        daemon_args=tuple(args.daemon_arg),
        logs_dir=args.logs,
    )
    reason = require_netbed()
    if reason is not None:
        print(f"bench.wan skipped: {reason}")
        return
    started = time.monotonic()
    rows = run(settings)
    print(f"\n{latency_table(rows, settings)}\n\n{crowd_table(rows, settings)}")
    took_s = time.monotonic() - started
    print(
        f"\n(network RTT: 2 x the one-way delay; measured: a TCP connect between the hosts; {took_s:.0f} s)"
    )
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))


if __name__ == "__main__":
    main()
