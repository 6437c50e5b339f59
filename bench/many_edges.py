"""Many edges on one cloud site: N edges that nobody can dial, each keeping an uplink to the cloud
(:mod:`testing.many_edges`, msgbusd's own link code), and what they cost the cloud as N grows.

For each N: the cloud site's resident memory and Redis memory per idle edge (with N edges less with none,
over N), its CPU while they are idle (pings, timers) as a share of a core, the time from cold until all N
are connected, requests from the cloud to random edges and from the edges to the cloud at ``--rate`` a
second each way (p50, p99, nothing lost), and the cloud stopped (SIGTERM) and killed -9, then started
again: the time until 99 % and 100 % of the edges are back, the peak of handshakes a second and the cloud's
CPU meanwhile. Prints one JSON line per N.

    python -m bench.many_edges [--edges 1000,5000,10000] [--rate 200] [--duration 10] [--idle 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from bench.rpc import cpu_seconds, rss_mib
from testing.local_sites import LocalCluster, SiteProcess, stop_process
from testing.many_edges import ManyEdgesProcess
from wire import keys
from wire.envelope import Envelope, encode_payload

CLOUD = 1
EDGE_CMD = "edge.echo"
CLOUD_CMD = "cloud.echo"
# A daemon just ready, or just through a burst of handshakes, still frees and allocates for a moment: its
# memory and CPU are read after this long.
SETTLE_S = 2.0


def redis_used_bytes(url: str) -> int:
    with redis.Redis.from_url(url) as conn:
        return int(conn.info("memory")["used_memory"])


def pid_of(site: SiteProcess) -> int:
    assert site.process is not None
    return site.process.pid


def settled(
    edges: ManyEdgesProcess, done: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """The edges' counts once ``done`` holds for them, or as they are after ``timeout_s``."""
    try:
        return edges.wait_for(done, timeout_s, "the edges' counts")
    except TimeoutError:
        return edges.stats()


def back(edges: ManyEdgesProcess, count: int, since: float, timeout_s: float) -> dict[str, Any]:
    """After the cloud started again at ``since``: when 99 % and all of the edges were back, and the peak of
    uplinks opened in one second."""
    seen = edges.wait_for(lambda stats: stats["open"] == count, timeout_s, f"all {count} edges back")
    opened = sorted(edges.stats(opened=True)["opened_at"])
    per_second: dict[int, int] = {}
    for at in opened:
        per_second[int(at - since)] = per_second.get(int(at - since), 0) + 1
    return {
        "back_99_s": round(opened[int(0.99 * (len(opened) - 1))] - since, 2),
        "back_100_s": round(opened[-1] - since, 2),
        "handshakes_peak_per_s": max(per_second.values()),
        "dials": seen["dials"],
    }


async def cloud_calls(
    redis_url: str, edge_ids: range, rate_per_s: float, duration_s: float
) -> dict[str, Any]:
    """Requests from the cloud's apps to random edges at ``rate_per_s``: their round trips and the lost."""
    # No socket timeout: a blocking pop may wait longer than redis-py's default 5 s. A connection for each
    # call waiting (redis-py 8 allows 100 by default, and fails the next at once).
    conn = aioredis.Redis.from_url(redis_url, max_connections=4096, socket_timeout=None)
    round_trips: list[float] = []
    lost = 0

    async def call(edge: int) -> None:
        nonlocal lost
        ret = str(uuid.uuid4())
        env = Envelope(
            cmd=EDGE_CMD, dst=(edge,), ret=ret, dat=encode_payload(b"ping"), exp=60, now=int(time.time())
        )
        started = time.perf_counter()
        await conn.rpush(keys.LOCAL, env.encode())
        if await conn.blpop([ret], timeout=30) is None:
            lost += 1
        else:
            round_trips.append(time.perf_counter() - started)

    try:
        tasks = []
        started, count = time.monotonic(), int(rate_per_s * duration_s)
        for n in range(count):
            await asyncio.sleep(max(0.0, started + n / rate_per_s - time.monotonic()))
            tasks.append(asyncio.ensure_future(call(random.choice(edge_ids))))
        await asyncio.gather(*tasks)
    finally:
        await conn.aclose()
    round_trips.sort()
    return {
        "cloud_to_edge_p50_ms": round(1000 * statistics.median(round_trips), 2) if round_trips else None,
        "cloud_to_edge_p99_ms": round(1000 * round_trips[int(0.99 * (len(round_trips) - 1))], 2)
        if round_trips
        else None,
        "cloud_to_edge_lost": lost,
    }


def run(row: dict[str, Any], rate_per_s: float, duration_s: float, idle_s: float, back_s: float) -> None:
    """Measure ``row["edges"]`` edges, filling ``row`` as it goes: what was measured stays if a step fails."""
    count = row["edges"]
    edges = ManyEdgesProcess(cloud=CLOUD, count=count)
    cluster = LocalCluster(size=1, extra_twins=edges.twins()).start()
    cloud, redis_url = cluster.sites[0], cluster.redis[0].url
    try:
        time.sleep(SETTLE_S)
        rss_before, redis_before = rss_mib(pid_of(cloud)), redis_used_bytes(redis_url)
        cold_at = time.time()
        edges.start(cluster.twins_file)
        connected = back(edges, count, cold_at, back_s)
        row |= {
            "cold_100_s": connected["back_100_s"],
            "cold_handshakes_peak_per_s": connected["handshakes_peak_per_s"],
        }
        time.sleep(SETTLE_S)
        cpu_before, idle_started = cpu_seconds(pid_of(cloud)), time.monotonic()
        time.sleep(idle_s)
        idle_cpu = (cpu_seconds(pid_of(cloud)) - cpu_before) / (time.monotonic() - idle_started)
        row |= {
            "rss_kib_per_edge": round((rss_mib(pid_of(cloud)) - rss_before) * 1024 / count, 1),
            "redis_bytes_per_edge": round((redis_used_bytes(redis_url) - redis_before) / count, 1),
            "idle_core_share": round(idle_cpu, 4),
        }
        service = subprocess.Popen([sys.executable, "-m", "bench.echo_service", redis_url, CLOUD_CMD, "16"])
        try:
            replies_before = edges.stats()["replies"]
            edges.send(CLOUD_CMD, rate_per_s=rate_per_s, count=int(rate_per_s * duration_s))
            row |= asyncio.run(cloud_calls(redis_url, edges.ids, rate_per_s, duration_s))
            expected = replies_before + int(rate_per_s * duration_s)
            stats = settled(edges, lambda s: s["replies"] + s["requests_refused"] >= expected, 60)
            row |= {
                "edge_to_cloud_p50_ms": round(1000 * stats["round_trip_p50_s"], 2),
                "edge_to_cloud_p99_ms": round(1000 * stats["round_trip_p99_s"], 2),
                "edge_to_cloud_refused": stats["requests_refused"],
                "edge_to_cloud_unanswered": expected - stats["replies"] - stats["requests_refused"],
            }
        finally:
            stop_process(service)
        for how in ("sigterm", "kill9"):
            if how == "sigterm":
                cloud.stop()
            else:
                cloud.kill()
            started_at = time.time()
            cloud.start(timeout_s=120)
            cpu_at = cpu_seconds(pid_of(cloud))
            ready_at = time.time()
            returned = back(edges, count, started_at, back_s)
            busy_s = max(0.1, time.time() - ready_at)
            row |= {
                f"{how}_back_99_s": returned["back_99_s"],
                f"{how}_back_100_s": returned["back_100_s"],
                f"{how}_handshakes_peak_per_s": returned["handshakes_peak_per_s"],
                f"{how}_cloud_core_share": round((cpu_seconds(pid_of(cloud)) - cpu_at) / busy_s, 3),
            }
    finally:
        edges.stop()
        cluster.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--edges", default="1000,5000,10000", help="comma-separated numbers of edges")
    parser.add_argument("--rate", type=float, default=200.0, help="requests a second each way")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of requests each way")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the idle CPU is measured over")
    parser.add_argument("--back-timeout", type=float, default=600.0, help="seconds to wait for all edges")
    args = parser.parse_args()
    for count in (int(n) for n in args.edges.split(",")):
        row: dict[str, Any] = {"edges": count}
        try:
            run(row, args.rate, args.duration, args.idle, args.back_timeout)
        except TimeoutError as exc:
            row["error"] = str(exc)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
