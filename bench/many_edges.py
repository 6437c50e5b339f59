"""Many edges on one cloud site: N edges that nobody can dial, each keeping an uplink to the cloud
(:mod:`testing.many_edges`, msgbusd's own link code), and what they cost the cloud as N grows.

For each N: the cloud site's resident memory and Redis memory per idle edge (with N edges less with none,
over N), its CPU while they are idle (pings, timers) as a share of a core, the time from cold until all N
are connected, requests from the cloud to random edges and from the edges to the cloud at ``--rate`` a
second each way (p50, p99, nothing lost), and the cloud stopped (SIGTERM) and killed -9, then started
again: the time until 99 % and 100 % of the edges are back, the peak of handshakes a second, the cloud's
CPU meanwhile, and how often its event loop was late by more than 100 ms while they came (and the worst, as
the bound of its histogram bucket: ``msgbus_event_loop_lag_seconds``). Prints one JSON line per N.

``--one-way``: the requests go from the cloud to the edges only (the cloud's tail without the edges'
requests beside it). Beside the callers' p50 and p99, the requests the cloud itself took over 25 ms for
(accepted to answered: ``requests_cloud_round_trips_over_25ms``, and the bound the slowest was under).
``--no-restarts``: the run ends after the requests.

``--two-processes``: the same for a cloud site of two processes sharing its port (``--reuse-port``), and one
of them killed -9: how many of the edges were on it, and the time until every one of them is back on the
other and has answered a request.

The edges run in ``--edge-processes`` processes (two by default: on this machine's two cores one process
for 10,000 edges is what limits how fast they come back, not the cloud).

    python -m bench.many_edges [--edges 1000,5000,10000] [--rate 200] [--duration 10] [--idle 10]
    python -m bench.many_edges --two-processes --edges 10000
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
import redis.asyncio as aioredis

from bench.rpc import cpu_seconds, rss_mib
from testing.local_sites import LocalCluster, SiteProcess, stop_process, wait_until
from testing.many_edges import ManyEdgesProcess
from testing.site_metrics import histogram, stalls
from twin_resolver.base import Twin
from wire import keys
from wire.envelope import Envelope, encode_payload

CLOUD = 1
EDGE_CMD = "edge.echo"
CLOUD_CMD = "cloud.echo"
FIRST_EDGE = 100_000
# A daemon just ready, or just through a burst of handshakes, still frees and allocates for a moment: its
# memory and CPU are read after this long.
SETTLE_S = 2.0
LAG = "msgbus_event_loop_lag_seconds"
GC = "msgbus_gc_pause_seconds"
STALL_S = 0.1
# The cloud's own time for a request (accepted to answered), apart from its callers' and its Redis's.
ROUND_TRIP = "msgbus_round_trip_seconds"
SLOW_ROUND_TRIP_S = 0.025


@dataclass
class Fleet:
    """``count`` edges in ``processes`` simulator processes (each a range of twins)."""

    count: int
    processes: int = 2

    def __post_init__(self) -> None:
        per = -(-self.count // self.processes)
        self.parts = [
            ManyEdgesProcess(cloud=CLOUD, count=min(per, self.count - first), first=FIRST_EDGE + first)
            for first in range(0, self.count, per)
        ]

    @property
    def ids(self) -> range:
        return range(FIRST_EDGE, FIRST_EDGE + self.count)

    def twins(self) -> list[Twin]:
        return [twin for part in self.parts for twin in part.twins()]

    def start(self, twins_file: Any) -> None:
        for part in self.parts:
            part.start(twins_file)

    def stop(self) -> None:
        for part in self.parts:
            part.stop()

    def pids(self) -> list[int]:
        return [part.process.pid for part in self.parts if part.process is not None]

    def stats(self, *, opened: bool = False) -> dict[str, Any]:
        """The counts summed over the processes (the round trips' percentiles: the worst process's)."""
        total: dict[str, Any] = {}
        for part in self.parts:
            for key, value in part.stats(opened=opened).items():
                if isinstance(value, list):
                    total[key] = [*total.get(key, []), *value]
                elif key.startswith("round_trip"):
                    total[key] = max(total.get(key) or 0.0, value or 0.0)
                else:
                    total[key] = total.get(key, 0) + value
        return total

    def wait_for(self, done: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.clear()
            seen.update(self.stats())
            return done(seen)

        wait_until(holds, timeout_s, what)
        return seen

    def send(self, cmd: str, rate_per_s: float, count: int) -> None:
        for part in self.parts:
            part.send(cmd, rate_per_s=rate_per_s / len(self.parts), count=count // len(self.parts))


def redis_used_bytes(url: str) -> int:
    with redis.Redis.from_url(url) as conn:
        return int(conn.info("memory")["used_memory"])


def pid_of(site: SiteProcess) -> int:
    assert site.process is not None
    return site.process.pid


def settled(fleet: Fleet, done: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
    """The edges' counts once ``done`` holds for them, or as they are after ``timeout_s``."""
    try:
        return fleet.wait_for(done, timeout_s, "the edges' counts")
    except TimeoutError:
        return fleet.stats()


def back(fleet: Fleet, since: float, timeout_s: float) -> dict[str, Any]:
    """After the cloud started again at ``since``: when 99 % and all of the edges were back, and the peak of
    uplinks opened in one second."""
    count = fleet.count
    seen = fleet.wait_for(lambda stats: stats["open"] == count, timeout_s, f"all {count} edges back")
    opened = sorted(fleet.stats(opened=True)["opened_at"])
    per_second: dict[int, int] = {}
    for at in opened:
        per_second[int(at - since)] = per_second.get(int(at - since), 0) + 1
    return {
        "back_99_s": round(opened[int(0.99 * (len(opened) - 1))] - since, 2),
        "back_100_s": round(opened[-1] - since, 2),
        "handshakes_peak_per_s": max(per_second.values()),
        "dials": seen["dials"],
    }


def loop_stalls(
    site: SiteProcess, before: dict[float, float], before_gc: dict[float, float]
) -> dict[str, Any]:
    """How often, since the readings ``before``, the cloud's loop was late by over 100 ms (and the bound the
    worst was under), and its longest collector pause (as a bound)."""
    late, worst = stalls(before, histogram(site, LAG), STALL_S)
    _, worst_gc = stalls(before_gc, histogram(site, GC), STALL_S)
    return {"stalls_over_100ms": late, "worst_stall_under_s": worst, "worst_gc_under_s": worst_gc}


async def cloud_calls(
    redis_url: str, edge_ids: Sequence[int], rate_per_s: float, duration_s: float
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


async def call_each(redis_url: str, edge_ids: Sequence[int], timeout_s: float) -> tuple[int, float]:
    """One request to each of ``edge_ids`` at once, their replies on one queue: how many edges answered,
    and how long after the requests were pushed the last did (s)."""
    conn = aioredis.Redis.from_url(redis_url, socket_timeout=None)
    ret = str(uuid.uuid4())
    waiting = set(edge_ids)
    last_s = 0.0
    try:
        now = int(time.time())
        await conn.rpush(
            keys.LOCAL,
            *(
                Envelope(
                    cmd=EDGE_CMD,
                    dst=(edge,),
                    ret=ret,
                    dat=encode_payload(b"back?"),
                    exp=120,
                    retries=3,
                    now=now,
                ).encode()
                for edge in edge_ids
            ),
        )
        started = time.monotonic()
        deadline = started + timeout_s
        while waiting and (left := deadline - time.monotonic()) > 0:
            popped = await conn.blpop([ret], timeout=max(1, int(left)))
            if popped is None:
                continue
            reply = Envelope.decode(popped[1])
            if not reply.err:
                waiting.discard(reply.src)
                last_s = time.monotonic() - started
    finally:
        await conn.aclose()
    return len(edge_ids) - len(waiting), last_s


def run(row: dict[str, Any], args: argparse.Namespace) -> None:
    """Measure ``row["edges"]`` edges, filling ``row`` as it goes: what was measured stays if a step fails."""
    count = row["edges"]
    fleet = Fleet(count, args.edge_processes)
    cluster = LocalCluster(size=1, extra_twins=fleet.twins()).start()
    cloud, redis_url = cluster.sites[0], cluster.redis[0].url
    try:
        time.sleep(SETTLE_S)
        rss_before, redis_before = rss_mib(pid_of(cloud)), redis_used_bytes(redis_url)
        lag, gc_pauses = histogram(cloud, LAG), histogram(cloud, GC)
        cold_at = time.time()
        fleet.start(cluster.twins_file)
        connected = back(fleet, cold_at, args.back_timeout)
        row |= {
            "cold_100_s": connected["back_100_s"],
            "cold_handshakes_peak_per_s": connected["handshakes_peak_per_s"],
            **{f"cold_{key}": value for key, value in loop_stalls(cloud, lag, gc_pauses).items()},
        }
        time.sleep(SETTLE_S)
        cpu_before, idle_started = cpu_seconds(pid_of(cloud)), time.monotonic()
        time.sleep(args.idle)
        idle_cpu = (cpu_seconds(pid_of(cloud)) - cpu_before) / (time.monotonic() - idle_started)
        row |= {
            "rss_kib_per_edge": round((rss_mib(pid_of(cloud)) - rss_before) * 1024 / count, 1),
            "redis_bytes_per_edge": round((redis_used_bytes(redis_url) - redis_before) / count, 1),
            "idle_core_share": round(idle_cpu, 4),
        }
        service = subprocess.Popen([sys.executable, "-m", "bench.echo_service", redis_url, CLOUD_CMD, "16"])
        try:
            replies_before = fleet.stats()["replies"]
            lag, gc_pauses = histogram(cloud, LAG), histogram(cloud, GC)
            round_trips = histogram(cloud, ROUND_TRIP)
            if not args.one_way:
                fleet.send(CLOUD_CMD, args.rate, int(args.rate * args.duration))
            row |= asyncio.run(cloud_calls(redis_url, fleet.ids, args.rate, args.duration))
            if not args.one_way:
                expected = replies_before + int(args.rate * args.duration)
                stats = settled(fleet, lambda s: s["replies"] + s["requests_refused"] >= expected, 60)
                row |= {
                    "edge_to_cloud_p50_ms": round(1000 * stats["round_trip_p50_s"], 2),
                    "edge_to_cloud_p99_ms": round(1000 * stats["round_trip_p99_s"], 2),
                    "edge_to_cloud_refused": stats["requests_refused"],
                    "edge_to_cloud_unanswered": expected - stats["replies"] - stats["requests_refused"],
                }
            row |= {f"requests_{key}": value for key, value in loop_stalls(cloud, lag, gc_pauses).items()}
            slow, worst = stalls(round_trips, histogram(cloud, ROUND_TRIP), SLOW_ROUND_TRIP_S)
            row |= {"requests_cloud_round_trips_over_25ms": slow, "requests_cloud_round_trip_under_s": worst}
        finally:
            stop_process(service)
        for how in ("sigterm", "kill9") if args.restarts else ():
            if how == "sigterm":
                cloud.stop()
            else:
                cloud.kill()
            started_at = time.time()
            cloud.start(timeout_s=120)
            cpu_at = cpu_seconds(pid_of(cloud))
            ready_at = time.time()
            lag, gc_pauses = histogram(cloud, LAG), histogram(cloud, GC)
            returned = back(fleet, started_at, args.back_timeout)
            busy_s = max(0.1, time.time() - ready_at)
            row |= {
                f"{how}_back_99_s": returned["back_99_s"],
                f"{how}_back_100_s": returned["back_100_s"],
                f"{how}_handshakes_peak_per_s": returned["handshakes_peak_per_s"],
                f"{how}_cloud_core_share": round((cpu_seconds(pid_of(cloud)) - cpu_at) / busy_s, 3),
                **{f"{how}_{key}": value for key, value in loop_stalls(cloud, lag, gc_pauses).items()},
            }
    finally:
        fleet.stop()
        cluster.cleanup()


def uplinks_opened_to(site: SiteProcess, since: float) -> set[int]:
    """The edges whose uplink opened to this process since ``since`` (unix time), from its log."""
    twins = set()
    for raw in site.log().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if datetime.fromisoformat(line["ts"]).timestamp() >= since and str(line.get("msg", "")).endswith(
            "opened its uplink to this site"
        ):
            twins.add(int(line["twin"]))
    return twins


def run_two_processes(row: dict[str, Any], args: argparse.Namespace) -> None:
    """A cloud site of two processes; one killed -9: its edges back on the other, and each answering."""
    count = row["edges"]
    fleet = Fleet(count, args.edge_processes)
    cluster = LocalCluster(size=1, processes=2, extra_twins=fleet.twins()).start()
    try:
        started_at = time.time()
        fleet.start(cluster.twins_file)
        row["cold_100_s"] = back(fleet, started_at, args.back_timeout)["back_100_s"]
        kept, killed = cluster.processes_of(CLOUD)
        on_killed = uplinks_opened_to(killed, started_at)
        row["edges_on_killed"] = len(on_killed)
        time.sleep(SETTLE_S)
        killed.kill()
        killed_at = time.time()
        # A request to each of its edges at once, right after the kill: answered once the edge is back.
        answered, last_s = asyncio.run(call_each(cluster.redis[0].url, sorted(on_killed), args.back_timeout))
        returned = back(fleet, killed_at, args.back_timeout)
        row |= {
            "killed_edges_back_100_s": returned["back_100_s"],
            "killed_edges_on_the_other": len(on_killed & uplinks_opened_to(kept, killed_at)),
            "killed_edges_answered": answered,
            "killed_edges_all_answered_s": round(last_s, 2),
        }
    finally:
        fleet.stop()
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
    parser.add_argument("--edge-processes", type=int, default=2, help="processes the edges run in")
    parser.add_argument(
        "--one-way", action="store_true", help="requests from the cloud to the edges only, none the other way"
    )
    parser.add_argument(
        "--two-processes", action="store_true", help="a cloud of two processes, one of them killed -9"
    )
    parser.add_argument(
        "--no-restarts",
        dest="restarts",
        action="store_false",
        help="end after the requests (no SIGTERM, kill -9)",
    )
    args = parser.parse_args()
    for count in (int(n) for n in args.edges.split(",")):
        row: dict[str, Any] = {"edges": count, "two_processes": args.two_processes}
        try:
            (run_two_processes if args.two_processes else run)(row, args)
        except TimeoutError as exc:
            row["error"] = str(exc)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
