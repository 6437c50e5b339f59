"""A site with a big backlog: one msgbusd, a twin that is down (its twins harness not started yet) while
requests for it pile up, and a twin that answers all along, for the other traffic meanwhile.

    with BacklogSite(hold_offline=True) as site:
        site.push(100_000)
        site.wait_waiting(100_000)
        site.bring_back()
        drain = site.wait_drained(100_000)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from testing.local_sites import LocalCluster, wait_until
from testing.many_twins import ManyTwinsProcess
from wire import keys
from wire.envelope import Envelope, encode_payload

DOWN_TWIN = 2000
UP_TWIN = 3000
CMD = "backlog.echo"
PAYLOAD = b"x" * 64
# Pushed per round trip, and at most this many wait in the site's local queue (as callers at full speed).
PUSH_BATCH = 5_000
LOCAL_QUEUE_MAX = 20_000


def request(dst: int, ret: str, *, exp_s: int, retries: int) -> bytes:
    """A request as a local client pushes it (:data:`CMD`, :data:`PAYLOAD`)."""
    return Envelope(
        cmd=CMD,
        dst=(dst,),
        ret=ret,
        dat=encode_payload(PAYLOAD),
        exp=exp_s,
        retries=retries,
        now=int(time.time()),
    ).encode()


def rss_mib(pid: int) -> float:
    """A process's resident memory, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Drain:
    """How a backlog drained: from the first reply to the last."""

    count: int
    first_at: float
    last_at: float

    @property
    def per_s(self) -> float:
        return (self.count - 1) / max(self.last_at - self.first_at, 1e-6)


@dataclass
class BacklogSite:
    """One site (``--hold-offline`` or not), twin :data:`DOWN_TWIN` that is down until :meth:`bring_back`,
    and twin :data:`UP_TWIN` that answers; every request to the down twin has the return queue
    :attr:`ret`."""

    hold_offline: bool = False
    extra_args: tuple[str, ...] = ()
    # Requests to the down twin: lifetime and tries (without --hold-offline, enough not to give up).
    exp_s: int = 7200
    retries: int = 1000
    ret: str = "backlog.replies"
    down: ManyTwinsProcess = field(default_factory=lambda: ManyTwinsProcess(first=DOWN_TWIN, count=1))
    up: ManyTwinsProcess = field(default_factory=lambda: ManyTwinsProcess(first=UP_TWIN, count=1))
    cluster: LocalCluster | None = None

    def __enter__(self) -> BacklogSite:
        args = [*(["--hold-offline"] if self.hold_offline else []), *self.extra_args]
        self.cluster = LocalCluster(size=1, extra_args=args, extra_twins=self.down.twins() + self.up.twins())
        self.cluster.start()
        try:
            self.up.start(self.cluster.twins_file)
        except BaseException:
            self.cluster.cleanup()
            raise
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.down.stop()
        self.up.stop()
        if self.cluster is not None:
            self.cluster.cleanup()

    @property
    def redis_url(self) -> str:
        assert self.cluster is not None
        return self.cluster.redis[0].url

    @property
    def pid(self) -> int:
        assert self.cluster is not None and self.cluster.sites[0].process is not None
        return self.cluster.sites[0].process.pid

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=60)

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def redis_used_bytes(self) -> int:
        with self.redis() as conn:
            return int(conn.info("memory")["used_memory"])

    def push(self, count: int) -> None:
        """Push ``count`` requests for the down twin as local clients do, in batches, never more than
        :data:`LOCAL_QUEUE_MAX` ahead of the daemon."""
        raw = request(DOWN_TWIN, self.ret, exp_s=self.exp_s, retries=self.retries)
        with self.redis() as conn:
            for start in range(0, count, PUSH_BATCH):
                while conn.llen(keys.LOCAL) > LOCAL_QUEUE_MAX:
                    time.sleep(0.02)
                conn.rpush(keys.LOCAL, *[raw] * min(PUSH_BATCH, count - start))

    def waiting(self) -> int:
        """How many entries wait in the down twin's send queue."""
        with self.redis() as conn:
            return int(conn.llen(keys.send_queue(DOWN_TWIN)))

    def wait_waiting(self, count: int, timeout_s: float = 600.0) -> None:
        """Wait until ``count`` requests were accepted and wait for the down twin."""
        wait_until(lambda: self.waiting() >= count, timeout_s, f"{count} requests to wait for the twin")

    def status(self) -> tuple[float, dict[str, Any]]:
        """``msgbus status --json`` as an operator runs it: how long it took, and what it said."""
        assert self.cluster is not None
        command = [str(Path(sys.executable).with_name("msgbus")), "status", "--json"]
        command += ["--redis", self.redis_url, "--site", self.cluster.sites[0].url]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        elapsed = time.monotonic() - started
        if not done.stdout.strip():
            raise RuntimeError(f"msgbus status said nothing (exit {done.returncode}): {done.stderr}")
        return elapsed, json.loads(done.stdout)

    def healthz_s(self) -> float:
        """How long the daemon's /healthz took to answer."""
        assert self.cluster is not None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        started = time.monotonic()
        with opener.open(f"{self.cluster.sites[0].url}/healthz", timeout=10) as response:
            response.read()
        return time.monotonic() - started

    def round_trip_p50_ms(self, count: int) -> float:
        """The median of ``count`` round trips, one after the other, to the twin that answers."""
        times = []
        with self.redis() as conn:
            for number in range(count):
                ret = f"backlog.other.{number}"
                started = time.perf_counter()
                conn.rpush(keys.LOCAL, request(UP_TWIN, ret, exp_s=30, retries=0))
                answer = conn.blpop([ret], timeout=30)
                if answer is None:
                    raise TimeoutError(f"no answer from twin {UP_TWIN} in 30 s")
                reply = Envelope.decode(answer[1])
                if reply.err:
                    raise RuntimeError(f"twin {UP_TWIN} answered an error: {reply.err}")
                times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def bring_back(self) -> None:
        """The down twin answers from now on."""
        assert self.cluster is not None
        self.down.start(self.cluster.twins_file)

    def wait_drained(self, count: int, timeout_s: float = 3600.0) -> Drain:
        """Wait until ``count`` replies reached the return queue; when the first and the last came."""
        first_at: float | None = None
        deadline = time.monotonic() + timeout_s
        with self.redis() as conn:
            while True:
                replies, now = int(conn.llen(self.ret)), time.monotonic()
                if replies and first_at is None:
                    first_at = now
                if replies >= count:
                    assert first_at is not None
                    return Drain(count, first_at, now)
                if now > deadline:
                    raise TimeoutError(f"{replies} of {count} replies after {timeout_s}s")
                time.sleep(0.02)
