"""Peers that are down: what probing them costs a site, and whether the twins that answer still get their
messages at full speed.

For each count of twins down (each with a message waiting for it, ``--hold-offline``), one site, the twins
served by :mod:`testing.many_twins`: after the first probes, the daemon's CPU and its probes per second are
read over a window while callers keep round trips going to the twins that answer. Prints one JSON line per
count.

    python -m bench.probing [--down 0,200,2000] [--up 100] [--probe-rate 50] [--window 20]

With ``--up 0`` nothing else is sent: the daemon's CPU is the probes' alone (``daemon_cpu_ms_per_probe``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from bench.rpc import cpu_seconds
from client.sync import Client
from testing.local_sites import LocalCluster, wait_until
from testing.many_twins import ManyTwinsProcess
from testing.site_metrics import metric, peers_probed

CMD = "probing.echo"
CALLERS = 4


def probes(cluster: LocalCluster) -> float:
    return metric(cluster.sites[0], "msgbus_messages_total", event="probed") or 0.0


def round_trips(redis_url: str, twins: list[int], stop: threading.Event, times: list[float]) -> None:
    """One caller: round trips to ``twins`` in turn until ``stop``; their times (ms) go to ``times``."""
    with Client(redis_url) as client:
        index = 0
        while not stop.is_set():
            started = time.perf_counter()
            [reply] = client.call(twins[index % len(twins)], CMD, b"x" * 64, exp=30, timeout=30)
            if reply.error:
                raise RuntimeError(reply.error)
            times.append((time.perf_counter() - started) * 1000)
            index += 1


def measure(down: int, up: int, probe_rate: float, window_s: float) -> dict[str, Any]:
    harness = ManyTwinsProcess(count=up + down, down=down)
    args = ["--hold-offline", "--probe-rate", str(probe_rate)]
    cluster = LocalCluster(size=1, extra_args=args, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        process = cluster.sites[0].process
        assert process is not None
        with Client(cluster.redis[0].url) as client:
            for twin in harness.down_twin_ids:
                client.send(twin, CMD, b"held", exp=3600)
        # Each twin found down gets its first probe at once, as senders' places free up; then they are paced.
        wait_until(lambda: peers_probed(cluster.sites[0]) == down, 120, "a first probe of each twin down")
        stop, times = threading.Event(), list[float]()
        callers = [
            threading.Thread(target=round_trips, args=(cluster.redis[0].url, harness.up_ids, stop, times))
            for _ in range(CALLERS if up else 0)
        ]
        for caller in callers:
            caller.start()
        time.sleep(2)
        count_before, probes_before = len(times), probes(cluster)
        cpu_before, started = cpu_seconds(process.pid), time.monotonic()
        time.sleep(window_s)
        elapsed = time.monotonic() - started
        cpu, made, done = cpu_seconds(process.pid) - cpu_before, probes(cluster) - probes_before, len(times)
        stop.set()
        for caller in callers:
            caller.join()
        window = times[count_before:done]
        return {
            "down": down,
            "up": up,
            "probe_rate": probe_rate,
            "probes_per_s": round(made / elapsed, 1),
            "daemon_cpu_share": round(cpu / elapsed, 3),
            "rpc_per_s": round(len(window) / elapsed, 1),
            "p50_ms": round(statistics.median(window), 2) if window else None,
            "daemon_cpu_ms_per_probe": round(cpu * 1000 / made, 3) if made and not window else None,
        }
    finally:
        harness.stop()
        cluster.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--down", default="0,200,2000", help="comma-separated counts of twins down")
    parser.add_argument("--up", type=int, default=100, help="twins that answer, called all along")
    parser.add_argument("--probe-rate", type=float, default=50.0)
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    args = parser.parse_args()
    for down in [int(n) for n in args.down.split(",")]:
        print(json.dumps(measure(down, args.up, args.probe_rate, args.window)), flush=True)


if __name__ == "__main__":
    main()
