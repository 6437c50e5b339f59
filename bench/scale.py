"""Many destinations: one site talks to N twins answered by one process (:mod:`testing.many_twins`), and
what that costs the daemon as N grows.

For each N, every request is pushed at once, one per twin (at least 1,000 in all: N = 1 gets 1,000, N = 100
ten each), and the run ends with the last answer. Prints one JSON line per N: requests per second, the
daemon's CPU per request, its resident memory before, after and (``--idle S``) after S seconds idle, and
the growth of the site's Redis memory.

    python -m bench.scale [--destinations 1,100,1000,10000] [--down N] [--no-links] [--idle S]
                          [--peer-bin GO_RMB] [--floor] [--at-once]

``--down N``: N of the destinations are down (their address refuses connections); each of their requests
is answered with its error once its tries are spent (one try: ``retries`` 0), counted in ``errors``.

``--peer-bin`` runs the same requests through a go-rmb daemon as the site (a measuring instrument, not part
of msgbus), right after msgbus for each N, against the same twins (it reaches each at its address alone).
With ``--down`` its run is judged by ``--at-once``'s figures only, as go-rmb answers almost none of the
requests to twins that are down (its retries are keyed by the client's uid, which RMB clients leave empty).

``--at-once``: the requests are pushed in one command (as a cloud asking every node one thing at once does),
not one by one, and the figures are taken once every reachable twin has answered (``reachable_seconds``,
``reachable_cpu_ms_per_rpc``); the down twins' errors are then waited for (``down_answered``, by when:
``down_answered_seconds``, and the daemon's CPU until then: ``down_answered_cpu_seconds``) for at most
``--down-wait`` seconds after the push.

``--floor`` runs them through :mod:`bench.floor_site` too: the least a site must do for them with the same
libraries (sign, POST on a connection of its own, check the reply's signature, push it), nothing kept.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from bench.floor_site import READY_LINE as FLOOR_READY_LINE
from bench.go_rmb import go_rmb_sites
from bench.rpc import cpu_seconds, rss_mib
from client.protocol import build_request
from client.sync import Client
from msgbusd.identity.signing import Signer
from testing.local_sites import LocalCluster, RedisProcess, free_port, stop_process
from testing.many_twins import ManyTwinsProcess
from twin_resolver.base import Twin
from twin_resolver.static import write_twin_file
from wire import keys
from wire.envelope import Envelope

MIN_REQUESTS = 1_000
CMD = "scale.echo"
PAYLOAD = b"x" * 64
# The harness's twins start at this id.
FIRST_TWIN = 1000


def redis_used_mib(url: str) -> float:
    with redis.Redis.from_url(url) as conn:
        return int(conn.info("memory")["used_memory"]) / 2**20


@dataclasses.dataclass(frozen=True)
class Options:
    links: bool = True
    idle_s: float = 0.0
    down: int = 0
    at_once: bool = False
    down_wait_s: float = 60.0
    reachable_wait_s: float = 120.0


def run(destinations: int, options: Options) -> dict[str, Any]:
    harness = ManyTwinsProcess(first=FIRST_TWIN, count=destinations, down=options.down, links=options.links)
    cluster = LocalCluster(size=1, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        process = cluster.sites[0].process
        assert process is not None
        return {
            "system": "msgbus",
            "links": options.links,
            "down": options.down,
            **measure(destinations, process.pid, cluster.redis[0].url, options),
        }
    finally:
        harness.stop()
        cluster.cleanup()


def run_go_rmb(binary: str, destinations: int, options: Options) -> dict[str, Any]:
    harness = ManyTwinsProcess(first=FIRST_TWIN, count=destinations, down=options.down, links=False)
    with go_rmb_site(binary, harness) as (pid, redis_url):
        return {
            "system": "go-rmb",
            "links": False,
            "down": options.down,
            **measure(destinations, pid, redis_url, options),
        }


@contextlib.contextmanager
def go_rmb_site(binary: str, harness: ManyTwinsProcess) -> Iterator[tuple[int, str]]:
    """A go-rmb daemon as twin 1 with its own Redis, and the harness's twins at their addresses alone."""
    twins = harness.twins()
    with go_rmb_sites(binary, [1], others=twins) as (site,), tempfile.TemporaryDirectory() as workdir:
        # The harness reads the site's key and address from a twin file of msgbus's format.
        twins_file = Path(workdir) / "twins.json"
        write_twin_file(twins_file, [site.identity, *twins])
        try:
            harness.start(twins_file)
            yield site.pid, site.redis.url
        finally:
            harness.stop()


def run_floor(destinations: int, options: Options) -> dict[str, Any]:
    harness = ManyTwinsProcess(first=FIRST_TWIN, count=destinations, links=False)
    with floor_site(harness) as (pid, redis_url):
        return {"system": "floor", "links": False, **measure(destinations, pid, redis_url, options)}


@contextlib.contextmanager
def floor_site(harness: ManyTwinsProcess, twin: int = 1) -> Iterator[tuple[int, str]]:
    """:mod:`bench.floor_site` as twin ``twin`` with its own Redis, and the harness's twins."""
    seed, port = os.urandom(32), free_port()
    identity = Twin(id=twin, address=f"127.0.0.1:{port}", public_key=Signer(seed, "ed25519").public_key)
    redis_server = RedisProcess()
    process: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory() as workdir:
        twins_file = Path(workdir) / "twins.json"
        write_twin_file(twins_file, [identity, *harness.twins()])
        try:
            redis_server.start()
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.floor_site", "--redis", redis_server.url, "--port", str(port),
                 "--seed", seed.hex(), "--twins", str(twins_file), "--twin", str(twin)],
                stdout=subprocess.PIPE,
            )  # fmt: skip
            assert process.stdout is not None
            if FLOOR_READY_LINE not in process.stdout.readline().decode():
                raise RuntimeError("bench.floor_site did not start")
            harness.start(twins_file)
            yield process.pid, redis_server.url
        finally:
            harness.stop()
            stop_process(process)
            if process is not None and process.stdout is not None:
                process.stdout.close()
            redis_server.cleanup()


def measure(destinations: int, pid: int, redis_url: str, options: Options) -> dict[str, Any]:
    """Push one request per twin (at least 1,000 in all) to the site whose daemon is ``pid`` and wait for
    every answer."""
    if options.at_once:
        return measure_at_once(destinations, pid, redis_url, options)
    requests = max(destinations, MIN_REQUESTS)
    targets = [FIRST_TWIN + n % destinations for n in range(requests)]
    rss_before, redis_before = rss_mib(pid), redis_used_mib(redis_url)
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    with Client(redis_url) as client:
        rets = [client.send(twin, CMD, PAYLOAD, exp=600, retries=0) for twin in targets]
        errors = sum(1 for ret in rets if client.wait(ret, timeout=600)[0].error)
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu_before
    result: dict[str, Any] = {
        "destinations": destinations,
        "requests": requests,
        "errors": errors,
        "seconds": round(elapsed, 2),
        "rpc_per_s": round(requests / elapsed, 1),
        "daemon_cpu_ms_per_rpc": round(cpu * 1000 / requests, 3),
        "rss_before_mib": round(rss_before, 1),
        "rss_after_mib": round(rss_mib(pid), 1),
        "redis_growth_mib": round(redis_used_mib(redis_url) - redis_before, 1),
    }
    if options.idle_s:
        time.sleep(options.idle_s)
        result["rss_idle_mib"] = round(rss_mib(pid), 1)
    return result


def measure_at_once(destinations: int, pid: int, redis_url: str, options: Options) -> dict[str, Any]:
    """One request per twin, all pushed in one command with one return queue. The time and daemon CPU
    until the last reachable twin's answer (within ``options.reachable_wait_s``; those never answered are
    counted), then how many of the down ones were answered (with their error) within
    ``options.down_wait_s`` of the push."""
    first_down = FIRST_TWIN + destinations - options.down
    ret = f"bench.scale.{uuid.uuid4()}"
    requests = [
        dataclasses.replace(build_request(FIRST_TWIN + n, CMD, PAYLOAD, exp=600, retries=0), ret=ret)
        for n in range(destinations)
    ]
    reachable_left, down_left = destinations - options.down, options.down
    errors, reachable_s, reachable_cpu, down_answered_s, down_cpu = 0, 0.0, 0.0, 0.0, 0.0
    rss_before = rss_mib(pid)
    with redis.Redis.from_url(redis_url, socket_timeout=None) as conn:
        cpu_before, started = cpu_seconds(pid), time.monotonic()
        conn.rpush(keys.LOCAL, *(request.encode() for request in requests))
        reachable_by, down_by = started + options.reachable_wait_s, started + options.down_wait_s
        while (reachable_left and time.monotonic() < reachable_by) or (
            down_left and time.monotonic() < max(reachable_by if reachable_left else 0.0, down_by)
        ):
            popped = conn.blpop([ret], timeout=1)
            if popped is None:
                continue
            reachable_came = False
            for raw in [popped[1], *(conn.lpop(ret, 1000) or [])]:
                reply = Envelope.decode(raw)
                if reply.src >= first_down or (reply.err and reply.src == 0):
                    down_left -= 1
                    down_answered_s, down_cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_before
                else:
                    reachable_left -= 1
                    errors += bool(reply.err)
                    reachable_came = True
            if reachable_came:
                reachable_s, reachable_cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_before
    return {
        "destinations": destinations,
        "at_once": True,
        "reachable_seconds": round(reachable_s, 2),
        "reachable_cpu_seconds": round(reachable_cpu, 2),
        "reachable_cpu_ms_per_rpc": round(reachable_cpu * 1000 / max(1, destinations - options.down), 3),
        "reachable_errors": errors,
        # Never answered (a site that lost them).
        "reachable_unanswered": reachable_left,
        "down_answered": options.down - down_left,
        "down_answered_seconds": round(down_answered_s, 2),
        # The daemon's CPU until the last down twin's error (all of the burst, when it came last).
        "down_answered_cpu_seconds": round(down_cpu, 2),
        "rss_before_mib": round(rss_before, 1),
        "rss_after_mib": round(rss_mib(pid), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--destinations", default="1,100,1000,10000", help="comma-separated twin counts")
    parser.add_argument("--down", type=int, default=0, metavar="N", help="N of the destinations are down")
    parser.add_argument("--no-links", dest="links", action="store_false", help="the twins take POSTs only")
    parser.add_argument("--idle", type=float, default=0.0, metavar="S", help="RSS again after S s idle")
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also run go-rmb as the site, side by side")
    parser.add_argument("--floor", action="store_true", help="also run bench.floor_site, side by side")
    parser.add_argument("--at-once", action="store_true", help="push every request in one command")
    parser.add_argument(
        "--down-wait", type=float, default=60.0, metavar="S", help="wait for down twins' errors"
    )
    args = parser.parse_args()
    for destinations in (int(n) for n in args.destinations.split(",")):
        options = Options(
            links=args.links,
            idle_s=args.idle,
            down=min(args.down, destinations),
            at_once=args.at_once,
            down_wait_s=args.down_wait,
        )
        print(json.dumps(run(destinations, options)), flush=True)
        if args.peer_bin and (args.at_once or not options.down):
            print(json.dumps(run_go_rmb(args.peer_bin, destinations, options)), flush=True)
        if args.floor and not options.down:
            print(json.dumps(run_floor(destinations, options)), flush=True)


if __name__ == "__main__":
    main()
