"""Round-trip benchmark: two sites on this machine, C concurrent callers, an echo service, one JSON line.

Each caller pushes a request to site 1's ``msgbus.system.local`` and pops its return queue; R workers on site
2 echo. After a warm-up, D seconds are measured: RPC/s, latency percentiles, lost requests, and CPU and memory
of every process read from /proc. ``--floor`` runs the same load through ``bench.floor_relay`` (the same
hops, no daemon logic) instead of msgbusd; ``--peer-bin GO_RMB`` through two go-rmb daemons of that build
(:mod:`bench.go_rmb`), each row right after msgbus's. ``--uplink``: site 2 has no address in the twin map and
is reached over the uplink it keeps to site 1 (its requests' replies too). ``--relay``: site 2 has no address
and names a third site, run with ``--relay``, as its relay; site 1 reaches it there, its payloads encrypted
for site 2 (site 2 answers site 1 directly).

    python -m bench.rpc --clients 16 --payload 64 --duration 10 [--floor] [--peer-bin GO_RMB]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

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


@dataclass
class Load:
    clients: int
    payload: bytes
    fanout: int = 1
    timeout_s: float = 10.0
    latencies: list[float] = field(default_factory=list)
    lost: int = 0
    measuring: bool = False

    async def caller(self, redis_url: str, stop: asyncio.Event) -> None:
        conn = aioredis.Redis.from_url(redis_url, socket_timeout=30)
        dat = encode_payload(self.payload)
        dst = (2,) * self.fanout
        try:
            while not stop.is_set():
                ret = str(uuid.uuid4())
                request = Envelope(cmd=CMD, dst=dst, ret=ret, dat=dat, exp=60, now=int(time.time())).encode()
                started = time.perf_counter()
                await conn.rpush(keys.LOCAL, request)
                got = 0
                deadline = started + self.timeout_s
                while got < self.fanout and time.perf_counter() < deadline:
                    if await conn.blpop([ret], timeout=1) is not None:
                        got += 1
                if self.measuring:
                    if got < self.fanout:
                        self.lost += self.fanout - got
                    else:
                        self.latencies.append(time.perf_counter() - started)
        finally:
            await conn.aclose()


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
    key_type: str, extra_args: list[str], processes: int = 1, uplink: bool = False, relay: bool = False
) -> Iterator[tuple[list[str], dict[str, int]]]:
    """Two sites; with ``uplink``, site 2 has no address and is reached over the uplink it keeps to site 1;
    with ``relay``, through a third site, its relay."""
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
    redis_urls: list[str], pids: dict[str, int], load: Load, warmup_s: float, duration_s: float
) -> dict[str, object]:
    """Run the callers against site 1 and measure a window of ``duration_s`` after ``warmup_s``."""
    pids = {**pids, "loadgen": os.getpid()}
    stop = asyncio.Event()
    callers = [asyncio.create_task(load.caller(redis_urls[0], stop)) for _ in range(load.clients)]
    await asyncio.sleep(warmup_s)
    processes = Processes(pids)
    cpu_before = processes.cpu()
    commands_before = await redis_commands(redis_urls)
    load.measuring = True
    started = time.perf_counter()
    await asyncio.sleep(duration_s)
    load.measuring = False
    elapsed = time.perf_counter() - started
    cpu_after = processes.cpu()
    # The callers' and the service's own commands are in it too; the same for every system measured.
    commands = await redis_commands(redis_urls) - commands_before
    rss = {role: round(rss_mib(pid), 1) for role, pid in pids.items()}
    stop.set()
    await asyncio.gather(*callers)
    rpcs = len(load.latencies)
    cpu = {role: cpu_after[role] - cpu_before[role] for role in cpu_before}
    daemons = sum(v for role, v in cpu.items() if role.startswith(DAEMON_ROLES))
    ordered = sorted(load.latencies)

    def percentile(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2) if ordered else 0.0

    return {
        "rpc_per_s": round(rpcs / elapsed, 1),
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2) if ordered else 0.0,
        "lost": load.lost,
        "cpu_percent": {role: round(100 * v / elapsed, 1) for role, v in cpu.items()},
        "rss_mib": rss,
        "daemon_cpu_ms_per_rpc": round(1000 * daemons / rpcs, 3) if rpcs else None,
        "total_cpu_ms_per_rpc": round(1000 * sum(cpu.values()) / rpcs, 3) if rpcs else None,
        "redis_commands_per_rpc": round(commands / rpcs, 1) if rpcs else None,
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
    """One row. With ``event_log``, both daemons write their event logs (to a directory removed after);
    without ``links``, the sites send each other POSTs, as to go-rmb sites; with ``peer_bin``, the sites are
    two go-rmb daemons of that build (the callers and the service unchanged)."""
    load = Load(clients=clients, payload=b"x" * payload, fanout=fanout)
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
            sites = msgbus_sites(args.key_type, daemon_args, processes, uplink, relay)
            system = "msgbus + event log" if event_log else "msgbus" if links else "msgbus, POSTs"
            if processes > 1:
                system += f", {processes} processes per site"
            if uplink:
                system += ", site 2 over its uplink"
            if relay:
                system += ", site 2 through a relay"
        row = _run_sites(args, load, sites)
    return {"system": system, "clients": clients, "payload_bytes": payload, "fanout": fanout, **row}


def _run_sites(
    args: argparse.Namespace,
    load: Load,
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
    parser.add_argument("--clients", default="1,16,64", help="comma-separated concurrency levels")
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
    args = parser.parse_args()
    for payload in (int(p) for p in args.payload.split(",")):
        for clients in (int(c) for c in args.clients.split(",")):
            print(json.dumps(run_case(args, clients, payload, args.fanout, False)), flush=True)
            if args.peer_bin:
                row = run_case(args, clients, payload, args.fanout, False, peer_bin=args.peer_bin)
                print(json.dumps(row), flush=True)
            if args.floor:
                print(json.dumps(run_case(args, clients, payload, args.fanout, True)), flush=True)


if __name__ == "__main__":
    main()
