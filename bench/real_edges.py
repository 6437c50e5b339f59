"""Real edges on one cloud site: N edge sites (each an msgbusd with its own redis-server, no address in the
twin map, ``--uplink`` to the cloud), and what they cost the cloud while idle, beside
:mod:`bench.many_edges`'s simulated ones.

The cloud starts alone and idles ``--idle`` s (its own CPU and memory with no edge); then the N edges start,
and once every uplink is open the cloud idles ``--idle`` s again. Prints one JSON line per N: the cloud's
resident memory per edge (with N less with none, over N), its CPU with none and with N as a share of one
core, and that difference pro rata for 10,000 edges; then one request from the cloud to each edge (every
one answered, by the edge's own echo service). At 50-100 edges the difference is within the noise of the
cloud's own timers (about 1 % of a core): the figure bounds what an edge costs rather than measures it.

    python -m bench.real_edges [--edges 50,100] [--idle 60]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.rpc import cpu_seconds, rss_mib
from client.sync import Client
from msgbusd.site.memory import RELEASE_EVERY_S
from testing.local_sites import LocalCluster, SiteProcess, stop_process, wait_until

CLOUD = 1
EDGE_CMD = "edge.echo"
# A daemon just ready, or just through its edges' handshakes, holds memory that its next collection of cycles
# and trim of the C library's heap (every RELEASE_EVERY_S) give back: the figures are read after one.
SETTLE_S = RELEASE_EVERY_S + 5.0
PRO_RATA = 10_000


def uplinks_open(cloud: SiteProcess) -> int:
    return cloud.log().count("opened its uplink to this site")


def idle_share(pid: int, seconds: float) -> float:
    """The share of one core process ``pid`` used over ``seconds``."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def run(count: int, idle_s: float) -> dict[str, Any]:
    cluster = LocalCluster(size=1 + count, extra_args=["--log-level", "info"]).prepare()
    services: list[subprocess.Popen[bytes]] = []
    try:
        cloud, edges = cluster.sites[0], cluster.sites[1:]
        for edge in edges:
            edge.advertised_address = ""
            edge.extra_args = [*edge.extra_args, "--uplink", str(CLOUD)]
        cluster.write_twins()
        cloud.start()
        assert cloud.process is not None
        pid = cloud.process.pid
        time.sleep(SETTLE_S)
        rss_alone, cpu_alone = rss_mib(pid), idle_share(pid, idle_s)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda edge: edge.start(timeout_s=120), edges))
        wait_until(lambda: uplinks_open(cloud) >= count, 120, f"{count} uplinks open")
        time.sleep(SETTLE_S)
        cpu_with = idle_share(pid, idle_s)
        rss_with = rss_mib(pid)
        for server in cluster.redis[1:]:
            services.append(
                subprocess.Popen([sys.executable, "-m", "bench.echo_service", server.url, EDGE_CMD, "1"])
            )
        with Client(cluster.redis[0].url) as client:
            rets = [client.send(edge.twin, EDGE_CMD, b"there?", exp=120, retries=3) for edge in edges]
            answered = sum(not client.wait(ret, timeout=60)[0].error for ret in rets)
        return {
            "edges": count,
            "rss_kib_per_edge": round((rss_with - rss_alone) * 1024 / count, 1),
            "idle_core_share_alone": round(cpu_alone, 4),
            "idle_core_share_with_edges": round(cpu_with, 4),
            f"idle_core_share_per_{PRO_RATA}_edges": round((cpu_with - cpu_alone) * PRO_RATA / count, 3),
            "answered": answered,
        }
    finally:
        for service in services:
            stop_process(service)
        cluster.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--edges", default="50,100", help="comma-separated numbers of edges")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds each idle CPU is measured over")
    args = parser.parse_args()
    for count in (int(n) for n in args.edges.split(",")):
        print(json.dumps(run(count, args.idle)), flush=True)


if __name__ == "__main__":
    main()
