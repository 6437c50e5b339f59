"""Round-trip benchmark: two sites on this machine, C concurrent callers, an echo service, one JSON line.

Each caller pushes a request to site 1's ``msgbus.system.local`` and pops its return queue; R workers on site
2 echo. After a warm-up, D seconds are measured: RPC/s, latency percentiles, lost requests, and CPU and memory
of every process read from /proc. ``--floor`` runs the same load through ``bench.floor_relay`` (the same
hops, no daemon logic) instead of msgbusd; ``--peer-bin GO_RMB`` through two go-rmb daemons of that build
(:mod:`bench.go_rmb`), each row right after msgbus's. ``--uplink``: site 2 has no address in the twin map and
is reached over the uplink it keeps to site 1 (its requests' replies too). ``--relay``: site 2 has no address
and names a third site, run with ``--relay``, as its relay; site 1 reaches it there, its payloads encrypted
for site 2 (site 2 answers site 1 directly).

``--clock-offset S``: site 2's wall clock is S seconds off (libfaketime), as on an edge box without a
battery for its clock.

``--rate R`` measures in open loop instead: a request every 1/R s on a fixed schedule, whatever the answers
do, each timed from its push to its answer (the closed-loop levels only with ``--clients`` too).

    python -m bench.rpc [--clients 16] [--rate 50] --payload 64 --duration 10 [--floor] [--peer-bin GO_RMB]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import redis.asyncio as aioredis

from bench.go_rmb import go_rmb_sites
from msgbusd.site.instance import pick
from testing.local_sites import LocalCluster, RedisProcess, free_port, port_open, wait_until
from wire import keys
from wire.envelope import Envelope, encode_payload

CMD = "bench.echo"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The roles of the processes whose CPU is the daemons' (msgbusd, the floor's relays, go-rmb).
DAEMON_ROLES = ("msgbusd", "relay", "go-rmb")
DEFAULT_CLIENTS = "1,16,64"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def echo_request(dat: str, fanout: int) -> tuple[str, bytes]:
    """A request for the echo service at twin 2 (``fanout`` times over): its return queue and its envelope."""
    ret = str(uuid.uuid4())
    return ret, Envelope(cmd=CMD, dst=(2,) * fanout, ret=ret, dat=dat, exp=60, now=int(time.time())).encode()


async def round_trip(
    conn: aioredis.Redis, request: bytes, ret: str, fanout: int, deadline: float
) -> tuple[int, float]:
    """Push ``request`` to site 1 and pop its answers from ``ret`` until ``deadline``: how many came, and when
    the last did."""
    await conn.rpush(keys.LOCAL, request)
    got, answered = 0, 0.0
    while got < fanout and (left := deadline - time.perf_counter()) > 0:
        if await conn.blpop([ret], timeout=min(1.0, max(0.01, left))) is not None:
            got, answered = got + 1, time.perf_counter()
    return got, answered


class Traffic(Protocol):
    """What :func:`measure` runs: requests to site 1, their latencies and losses counted within a window."""

    latencies: list[float]
    lost: int

    async def start(self, redis_url: str, stop: asyncio.Event) -> asyncio.Task[None]:
        """Start sending; the task ends once ``stop`` is set and the requests sent are over."""
        ...

    def open_window(self) -> None: ...

    def close_window(self) -> None: ...


@dataclass
class Load:
    """Closed loop: each caller sends its next request once its last is answered."""

    clients: int
    payload: bytes
    fanout: int = 1
    timeout_s: float = 10.0
    latencies: list[float] = field(default_factory=list)
    lost: int = 0
    measuring: bool = False

    async def start(self, redis_url: str, stop: asyncio.Event) -> asyncio.Task[None]:
        async def callers() -> None:
            await asyncio.gather(*(self.caller(redis_url, stop) for _ in range(self.clients)))

        return asyncio.create_task(callers())

    def open_window(self) -> None:
        self.measuring = True

    def close_window(self) -> None:
        self.measuring = False

    async def caller(self, redis_url: str, stop: asyncio.Event) -> None:
        conn = aioredis.Redis.from_url(redis_url, socket_timeout=30)
        dat = encode_payload(self.payload)
        try:
            while not stop.is_set():
                ret, request = echo_request(dat, self.fanout)
                started = time.perf_counter()
                got, _ = await round_trip(conn, request, ret, self.fanout, started + self.timeout_s)
                if self.measuring:
                    if got < self.fanout:
                        self.lost += self.fanout - got
                    else:
                        self.latencies.append(time.perf_counter() - started)
        finally:
            await conn.aclose()


@dataclass
class IdleConnections:
    """Connections to site 1's Redis opened ahead, one per request in flight, so that a request does not wait
    for one to open. Each is a client of its own with a single connection."""

    redis_url: str
    socket_timeout_s: float
    idle: list[aioredis.Redis] = field(default_factory=list)
    opened: list[aioredis.Redis] = field(default_factory=list)

    async def open(self, count: int) -> None:
        new = [
            aioredis.Redis.from_url(
                self.redis_url, single_connection_client=True, socket_timeout=self.socket_timeout_s
            )
            for _ in range(count)
        ]
        self.opened.extend(new)
        await asyncio.gather(*(conn.ping() for conn in new))
        self.idle.extend(new)

    async def take(self) -> aioredis.Redis:
        if not self.idle:
            # More in flight than ever before: this request pays for the connection, and the pool keeps it,
            # so it grows to the most ever in flight (during the warm-up, unless the system slows down).
            await self.open(1)
        return self.idle.pop()

    def give_back(self, conn: aioredis.Redis) -> None:
        self.idle.append(conn)

    async def close(self) -> None:
        await asyncio.gather(*(conn.aclose() for conn in self.opened))


@dataclass
class OpenLoad:
    """Open loop: request i is due at t0 + i/R and sent then, however many are still waiting for answers. Its
    latency runs from its push to its answer; how late the push was against the schedule (the event loop's
    timers round to a millisecond) is kept apart, so that a load generator that falls behind shows. Only the
    requests due within the window count."""

    rate_per_s: float
    payload: bytes
    fanout: int = 1
    timeout_s: float = 10.0
    latencies: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    lost: int = 0
    window_opened: float = math.inf
    window_closed: float = math.inf

    async def start(self, redis_url: str, stop: asyncio.Event) -> asyncio.Task[None]:
        # Longer than any pop waits, whatever redis-py's default (5 s in redis-py 8).
        connections = IdleConnections(redis_url, socket_timeout_s=self.timeout_s + 10)
        # Enough for the answers of 50 ms in flight at once, and a few more.
        await connections.open(8 + math.ceil(self.rate_per_s * 0.05))
        return asyncio.create_task(self.schedule(connections, stop))

    def open_window(self) -> None:
        self.window_opened = time.perf_counter()

    def close_window(self) -> None:
        self.window_closed = time.perf_counter()

    async def schedule(self, connections: IdleConnections, stop: asyncio.Event) -> None:
        dat = encode_payload(self.payload)
        in_flight: set[asyncio.Task[None]] = set()
        stopped = asyncio.ensure_future(stop.wait())
        first = time.perf_counter()
        try:
            for number in itertools.count():
                due = first + number / self.rate_per_s
                await asyncio.wait([stopped], timeout=max(0.0, due - time.perf_counter()))
                if stopped.done():
                    break
                request = asyncio.create_task(self.request(connections, dat, due))
                in_flight.add(request)
                request.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)
        finally:
            stopped.cancel()
            await connections.close()

    async def request(self, connections: IdleConnections, dat: str, due: float) -> None:
        ret, request = echo_request(dat, self.fanout)
        conn = await connections.take()
        sent = time.perf_counter()
        try:
            got, answered = await round_trip(conn, request, ret, self.fanout, sent + self.timeout_s)
        finally:
            connections.give_back(conn)
        if self.window_opened <= due < self.window_closed:
            self.lateness.append(sent - due)
            if got < self.fanout:
                self.lost += self.fanout - got
            else:
                self.latencies.append(answered - sent)


@dataclass
class Processes:
    """The pids to account for, by role."""

    pids: dict[str, int]

    def cpu(self) -> dict[str, float]:
        return {role: cpu_seconds(pid) for role, pid in self.pids.items()}


def _spread_jobs(cluster: LocalCluster) -> None:
    """Names each site's processes so that sending to the other site is not the job of a process that takes
    the local requests or the services' replies: every message is handed from one process to another, as
    most are at a site that sends to many twins."""
    for site in cluster.sites:
        processes = [site, *cluster.siblings[site.twin]]
        (other,) = (str(other.twin) for other in cluster.sites if other is not site)
        names = _names_apart(other, [keys.LOCAL_LEASE, keys.REPLY_LEASE], f"site{site.twin}", len(processes))
        for process, name in zip(processes, names, strict=True):
            process.extra_args = [*process.extra_args, "--instance", name]


def _names_apart(job: str, others: list[str], prefix: str, count: int) -> list[str]:
    """``count`` instance names among which ``job`` goes to another instance than each of ``others``."""
    for attempt in range(1000):
        names = [f"{prefix}-{attempt}-{number}" for number in range(count)]
        if pick(job, names) not in {pick(other, names) for other in others}:
            return names
    raise RuntimeError(f"no names keep {job} apart from {others}")


@contextmanager
def msgbus_sites(
    key_type: str,
    extra_args: list[str],
    processes: int = 1,
    uplink: bool = False,
    relay: bool = False,
    clock_offset_s: float | None = None,
) -> Iterator[tuple[list[str], dict[str, int]]]:
    """Two sites; with ``uplink``, site 2 has no address and is reached over the uplink it keeps to site 1;
    with ``relay``, through a third site, its relay; with ``clock_offset_s``, site 2's clock is that far off
    (libfaketime)."""
    cluster = LocalCluster(
        size=3 if relay else 2,
        key_type=key_type,
        extra_args=["--log-level", "info", *extra_args],
        processes=processes,
    ).prepare()
    try:
        if processes > 1:
            _spread_jobs(cluster)
        if uplink:
            cluster.sites[1].advertised_address = ""
            for process in cluster.processes_of(2):
                process.extra_args = [*process.extra_args, "--uplink", "1"]
        if relay:
            cluster.sites[1].advertised_address = ""
            cluster.sites[1].relay = cluster.sites[2].address
            for process in cluster.processes_of(3):
                process.extra_args = [*process.extra_args, "--relay"]
        for process in cluster.processes_of(2):
            process.clock_offset_s = clock_offset_s
        cluster.launch()
        if uplink:
            wait_until(lambda: "opened its uplink" in cluster.sites[0].log(), 20, "site 2's uplink")
        if relay:
            wait_until(
                lambda: "opened its uplink" in cluster.sites[2].log(), 20, "site 2's link to its relay"
            )
        pids = {}
        for site, redis in zip(cluster.sites, cluster.redis, strict=True):
            assert redis.process is not None
            for number, process in enumerate(cluster.processes_of(site.twin), start=1):
                assert process.process is not None
                pids[f"msgbusd{site.twin}" + (f".{number}" if processes > 1 else "")] = process.process.pid
            pids[f"redis{site.twin}"] = redis.process.pid
        yield [r.url for r in cluster.redis], pids
    finally:
        cluster.cleanup()


@contextmanager
def floor_sites() -> Iterator[tuple[list[str], dict[str, int]]]:
    servers = [RedisProcess().start(), RedisProcess().start()]
    ports = [free_port(), free_port()]
    relays: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(2):
            peer = f"http://127.0.0.1:{ports[1 - index]}"
            relays.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.floor_relay", servers[index].url, str(ports[index]), peer],
                    stdout=subprocess.DEVNULL,
                )
            )
        for port in ports:
            wait_until(lambda port=port: port_open(port), 20, f"floor relay on {port}")  # type: ignore[misc]
        pids = {"relay1": relays[0].pid, "relay2": relays[1].pid}
        for index, server in enumerate(servers):
            assert server.process is not None
            pids[f"redis{index + 1}"] = server.process.pid
        yield [s.url for s in servers], pids
    finally:
        for relay in relays:
            relay.terminate()
            relay.wait(timeout=10)
        for server in servers:
            server.cleanup()


@contextmanager
def go_rmb_pair(binary: str) -> Iterator[tuple[list[str], dict[str, int]]]:
    """Two go-rmb sites, twins 1 and 2, as :func:`msgbus_sites` gives two msgbus sites."""
    with go_rmb_sites(binary, [1, 2]) as sites:
        pids = {}
        for site in sites:
            assert site.redis.process is not None
            pids[f"go-rmb{site.twin}"] = site.pid
            pids[f"redis{site.twin}"] = site.redis.process.pid
        yield [site.redis.url for site in sites], pids


async def redis_commands(redis_urls: list[str]) -> int:
    """Commands the Redis servers at ``redis_urls`` have processed so far, together."""
    total = 0
    for url in redis_urls:
        conn = aioredis.Redis.from_url(url)
        try:
            total += int((await conn.info("stats"))["total_commands_processed"])
        finally:
            await conn.aclose()
    return total


async def measure(
    redis_urls: list[str], pids: dict[str, int], load: Traffic, warmup_s: float, duration_s: float
) -> dict[str, object]:
    """Run ``load`` against site 1 and measure a window of ``duration_s`` after ``warmup_s``."""
    pids = {**pids, "loadgen": os.getpid()}
    stop = asyncio.Event()
    running = await load.start(redis_urls[0], stop)
    await asyncio.sleep(warmup_s)
    processes = Processes(pids)
    cpu_before = processes.cpu()
    commands_before = await redis_commands(redis_urls)
    load.open_window()
    started = time.perf_counter()
    await asyncio.sleep(duration_s)
    load.close_window()
    elapsed = time.perf_counter() - started
    cpu_after = processes.cpu()
    # The callers' and the service's own commands are in it too; the same for every system measured.
    commands = await redis_commands(redis_urls) - commands_before
    rss = {role: round(rss_mib(pid), 1) for role, pid in pids.items()}
    stop.set()
    await running
    rpcs = len(load.latencies)
    cpu = {role: cpu_after[role] - cpu_before[role] for role in cpu_before}
    daemons = sum(v for role, v in cpu.items() if role.startswith(DAEMON_ROLES))
    return {
        "rpc_per_s": round(rpcs / elapsed, 1),
        **latency_figures(load.latencies),
        "lost": load.lost,
        "cpu_percent": {role: round(100 * v / elapsed, 1) for role, v in cpu.items()},
        "rss_mib": rss,
        "daemon_cpu_ms_per_rpc": round(1000 * daemons / rpcs, 3) if rpcs else None,
        "total_cpu_ms_per_rpc": round(1000 * sum(cpu.values()) / rpcs, 3) if rpcs else None,
        "redis_commands_per_rpc": round(commands / rpcs, 1) if rpcs else None,
    }


def latency_figures(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)

    def percentile(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2) if ordered else 0.0

    return {
        "p50_ms": percentile(0.50),
        "p90_ms": percentile(0.90),
        "p99_ms": percentile(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2) if ordered else 0.0,
    }


def run_case(
    args: argparse.Namespace,
    clients: int,
    payload: int,
    fanout: int,
    floor: bool,
    event_log: bool = False,
    links: bool = True,
    peer_bin: str | None = None,
) -> dict[str, object]:
    """One closed-loop row. With ``event_log``, both daemons write their event logs (to a directory removed
    after); without ``links``, the sites send each other POSTs, as to go-rmb sites; with ``peer_bin``, the
    sites are two go-rmb daemons of that build (the callers and the service unchanged)."""
    load = Load(clients=clients, payload=b"x" * payload, fanout=fanout)
    system, row = _run_load(args, load, floor, event_log, links, peer_bin)
    return {
        "system": system,
        "mode": "closed",
        "clients": clients,
        "payload_bytes": payload,
        "fanout": fanout,
        **row,
    }


def run_open_case(
    args: argparse.Namespace,
    rate_per_s: float,
    payload: int,
    fanout: int,
    floor: bool,
    peer_bin: str | None = None,
) -> dict[str, object]:
    """One open-loop row: ``rate_per_s`` requests a second, as :func:`run_case` runs its callers."""
    load = OpenLoad(rate_per_s=rate_per_s, payload=b"x" * payload, fanout=fanout)
    system, row = _run_load(args, load, floor, peer_bin=peer_bin)
    return {
        "system": system,
        "mode": "open",
        "rate_per_s": rate_per_s,
        "payload_bytes": payload,
        "fanout": fanout,
        **row,
        "sent_late_p99_ms": latency_figures(load.lateness)["p99_ms"],
    }


def _run_load(
    args: argparse.Namespace,
    load: Traffic,
    floor: bool,
    event_log: bool = False,
    links: bool = True,
    peer_bin: str | None = None,
) -> tuple[str, dict[str, object]]:
    """The system's name and its measurement."""
    processes = getattr(args, "processes", 1)
    with tempfile.TemporaryDirectory(prefix="msgbus-bench-events-") as events_dir:
        daemon_args = [
            *(args.daemon_arg or []),
            *(["--event-log", events_dir] if event_log else []),
            *([] if links else ["--no-links"]),
        ]
        sites: AbstractContextManager[tuple[list[str], dict[str, int]]]
        if peer_bin:
            sites, system = go_rmb_pair(peer_bin), "go-rmb"
        elif floor:
            sites, system = floor_sites(), "floor"
        else:
            uplink, relay = getattr(args, "uplink", False), getattr(args, "relay", False)
            clock_offset_s = getattr(args, "clock_offset", None)
            sites = msgbus_sites(args.key_type, daemon_args, processes, uplink, relay, clock_offset_s)
            system = "msgbus + event log" if event_log else "msgbus" if links else "msgbus, POSTs"
            if processes > 1:
                system += f", {processes} processes per site"
            if uplink:
                system += ", site 2 over its uplink"
            if relay:
                system += ", site 2 through a relay"
            if clock_offset_s:
                system += f", site 2's clock {clock_offset_s:+g} s off"
        return system, _run_sites(args, load, sites)


def _run_sites(
    args: argparse.Namespace,
    load: Traffic,
    sites: AbstractContextManager[tuple[list[str], dict[str, int]]],
) -> dict[str, object]:
    with sites as (redis_urls, pids):
        command = [sys.executable, "-m", "bench.echo_service", redis_urls[1], CMD, str(args.workers)]
        service = subprocess.Popen(command)
        try:
            result = asyncio.run(
                measure(redis_urls, {**pids, "service": service.pid}, load, args.warmup, args.duration)
            )
        finally:
            service.terminate()
            service.wait(timeout=10)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients", help=f"comma-separated concurrency levels (default {DEFAULT_CLIENTS}; none with --rate)"
    )
    parser.add_argument("--rate", help="comma-separated rates, requests per second, each measured open loop")
    parser.add_argument("--payload", default="64", help="comma-separated payload sizes in bytes")
    parser.add_argument("--fanout", type=int, default=1, help="destinations per request")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=16, help="service workers on site 2")
    parser.add_argument("--key-type", default="ed25519")
    parser.add_argument("--floor", action="store_true", help="also measure the no-logic floor")
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also measure two go-rmb daemons of this build")
    parser.add_argument("--daemon-arg", action="append", help="extra msgbusd flag (repeatable)")
    parser.add_argument("--processes", type=int, default=1, help="msgbusd processes per site (--reuse-port)")
    parser.add_argument(
        "--uplink", action="store_true", help="site 2 has no address and keeps an uplink to site 1 (--uplink)"
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="site 2 has no address and is reached through a third site (--relay)",
    )
    parser.add_argument(
        "--clock-offset",
        type=float,
        metavar="S",
        help="site 2's wall clock S seconds off, e.g. -600 (needs faketime: make setup installs it)",
    )
    args = parser.parse_args()
    clients_levels = args.clients or ("" if args.rate else DEFAULT_CLIENTS)
    for payload in (int(p) for p in args.payload.split(",")):
        for clients in (int(c) for c in clients_levels.split(",") if c):
            print_rows(args, functools.partial(run_case, args, clients, payload, args.fanout))
        for rate in (float(r) for r in (args.rate or "").split(",") if r):
            print_rows(args, functools.partial(run_open_case, args, rate, payload, args.fanout))


def print_rows(args: argparse.Namespace, case: Callable[..., dict[str, object]]) -> None:
    """msgbus's row of ``case``, then go-rmb's and the floor's if asked for; ``case`` takes ``floor`` and
    ``peer_bin``."""
    print(json.dumps(case(False)), flush=True)
    if args.peer_bin:
        print(json.dumps(case(False, peer_bin=args.peer_bin)), flush=True)
    if args.floor:
        print(json.dumps(case(True)), flush=True)


if __name__ == "__main__":
    main()
