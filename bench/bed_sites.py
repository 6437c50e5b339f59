"""Two sites of each system on two hosts of the network test bed, for the benchmarks across real networks
(:mod:`bench.wan`, :mod:`bench.thin_link`): msgbus's pair and, with a go-rmb build, go-rmb's pair beside it
on the same hosts, so the delay or the thin link the bed puts between the hosts acts on both alike::

    caller (198.18.1.2)   msgbus twin 1 :8051, its Redis :6379   go-rmb twin 1 :8052, its Redis :6380
          |
        router            the delay line, the thin link's shapers
          |
    callee (198.18.2.2)   msgbus twin 2 :8051, its Redis :6379   go-rmb twin 2 :8052, its Redis :6380

Each Redis listens inside its host on 127.0.0.1 (what its daemon dials) and on a unix socket, which the
benchmark's callers and services reach from the root namespace. Leaving :func:`two_hosts` stops everything
and deletes the namespaces, also on SIGTERM, SIGHUP or Ctrl-C; a bed left by a process killed with -9 is
swept by the next one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from bench.go_rmb import write_go_twin_file
from msgbusd.identity.signing import Signer
from testing.local_sites import RedisProcess, stop_process, wait_until
from testing.netbed import BedSites, Host, NetBed
from testing.netbed.sites import SITE_PORT
from twin_resolver.base import Twin

GO_RMB_PORT = 8052
GO_RMB_REDIS_PORT = 6380
CALLER_TWIN = 1
CALLEE_TWIN = 2
READY_TIMEOUT_S = 20.0
# A TCP connect from one host to the other takes one network round trip (SYN there, SYN-ACK back).
RTT_SAMPLES = 5


@dataclass
class Pair:
    """Twin 1 (the caller's site) and twin 2 (the callee's) of one system, as the harness sees them."""

    system: str
    # The caller's Redis, then the callee's, as unix socket URLs.
    redis_urls: list[str]
    # The daemons' and the Redis servers' pids, by role (``bench.rpc``'s names: msgbusd1, go-rmb2, redis1).
    pids: dict[str, int]
    # Where each daemon writes its log, by role.
    logs: dict[str, Path] = field(default_factory=dict)

    def log_text(self) -> str:
        """Every daemon's log so far, each under its role."""
        parts = []
        for role, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"== {role} ==\n{text}")
        return "\n".join(parts)


@contextlib.contextmanager
def stopped_cleanly_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit`` while inside, as Ctrl-C raises ``KeyboardInterrupt``, so that
    the ``with`` blocks around the bed undo what they made instead of the process dying with them in place."""

    def leave(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, leave) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[NetBed, Host, Host]]:
    """A bed with two hosts, ``caller`` and ``callee``, removed on leaving (also on SIGTERM)."""
    with stopped_cleanly_on_signals(), NetBed() as bed:
        yield bed, bed.add_host("caller"), bed.add_host("callee")


@contextlib.contextmanager
def msgbus_pair(
    caller: Host, callee: Host, extra_args: Sequence[str] = (), key_type: str = "ed25519"
) -> Iterator[Pair]:
    """msgbus sites, twin 1 on ``caller`` and twin 2 on ``callee``, each daemon run with ``extra_args``."""
    with BedSites() as sites:
        first = sites.add(caller, twin=CALLER_TWIN, key_type=key_type, extra_args=extra_args)
        second = sites.add(callee, twin=CALLEE_TWIN, key_type=key_type, extra_args=extra_args)
        sites.start()
        pids = {}
        for site in (first, second):
            assert site.daemon.process is not None and site.redis.process is not None
            pids[f"msgbusd{site.twin}"] = site.daemon.process.pid
            pids[f"redis{site.twin}"] = site.redis.process.pid
        logs = {
            f"msgbusd{site.twin}": site.daemon.log_path for site in (first, second) if site.daemon.log_path
        }
        yield Pair("msgbus", [first.redis_url, second.redis_url], pids, logs)


@dataclass(eq=False)
class GoRmbBedSite:
    """A go-rmb daemon as twin ``twin`` on ``host``, its redis-server inside the same host on 127.0.0.1
    (go-rmb dials ``host:port`` only) with a unix socket beside it for the harness."""

    binary: str
    twin: int
    host: Host
    workdir: Path
    seed: bytes = field(default_factory=lambda: os.urandom(32))
    log_level: str = "error"
    redis: RedisProcess = field(init=False)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        redis_dir = self.workdir / f"go-redis-{self.twin}"
        redis_dir.mkdir()
        self.redis = RedisProcess(port=GO_RMB_REDIS_PORT, netns=self.host.netns, workdir=redis_dir)

    @property
    def identity(self) -> Twin:
        """This site's entry in go-rmb's twin file."""
        public_key = Signer(self.seed, "ed25519").public_key
        return Twin(id=self.twin, address=f"{self.host.address}:{GO_RMB_PORT}", public_key=public_key)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"go-rmb-{self.twin}.log"

    def command(self, twins_file: Path) -> list[str]:
        return [
            self.binary, "--twin", str(self.twin), "--seed", self.seed.hex(), "--twins", str(twins_file),
            "--redis", f"127.0.0.1:{GO_RMB_REDIS_PORT}", "--listen", f"{self.host.address}:{GO_RMB_PORT}",
            "--log-level", self.log_level,
        ]  # fmt: skip

    def start(self, twins_file: Path) -> GoRmbBedSite:
        """Start the Redis and the daemon, and wait until the daemon takes connections."""
        self.redis.start()
        with open(self.log_path, "ab") as log_file:
            self.process = self.host.popen(
                self.command(twins_file), stdout=log_file, stderr=subprocess.STDOUT
            )
        wait_until(self._listening, READY_TIMEOUT_S, f"go-rmb (twin {self.twin}) in {self.host.role}")
        return self

    def _listening(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"go-rmb (twin {self.twin}) exited with status {self.process.returncode}")
        try:
            self.host.connect(self.host.address, GO_RMB_PORT, 0.2).close()
        except OSError:
            return False
        return True

    def cleanup(self) -> None:
        stop_process(self.process)
        self.process = None
        self.redis.cleanup()


@contextlib.contextmanager
def go_rmb_pair(binary: str, caller: Host, callee: Host, log_level: str = "error") -> Iterator[Pair]:
    """go-rmb daemons of the build at ``binary``, twin 1 on ``caller`` and twin 2 on ``callee``."""
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"no go-rmb executable at {binary}")
    workdir = Path(tempfile.mkdtemp(prefix="msgbus-bed-go-rmb-"))
    sites = [
        GoRmbBedSite(binary, CALLER_TWIN, caller, workdir, log_level=log_level),
        GoRmbBedSite(binary, CALLEE_TWIN, callee, workdir, log_level=log_level),
    ]
    try:
        twins_file = workdir / "go-twins.json"
        write_go_twin_file(twins_file, [site.identity for site in sites])
        for site in sites:
            site.start(twins_file)
        pids = {}
        for site in sites:
            assert site.process is not None and site.redis.process is not None
            pids[f"go-rmb{site.twin}"] = site.process.pid
            pids[f"redis{site.twin}"] = site.redis.process.pid
        logs = {f"go-rmb{site.twin}": site.log_path for site in sites}
        yield Pair("go-rmb", [site.redis.socket_url for site in sites], pids, logs)
    finally:
        for site in sites:
            site.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def keep_logs(pair: Pair, directory: Path | None, label: str) -> None:
    """Copy ``pair``'s daemon logs into ``directory`` (if given) as ``<label>-<role>.log``."""
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    for role, path in pair.logs.items():
        if path.exists():
            shutil.copyfile(path, directory / f"{label}-{role}.log")


@contextlib.contextmanager
def service(module: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m module args...`` in the root namespace (a service on a site's Redis socket), stopped on
    leaving."""
    process = subprocess.Popen([sys.executable, "-m", module, *args])
    try:
        yield process
    finally:
        stop_process(process)


def network_rtt_ms(client: Host, server: Host, port: int = SITE_PORT, samples: int = RTT_SAMPLES) -> float:
    """The median time ``client`` takes to open a TCP connection to ``server``'s ``port``: one network
    round trip, as the bed makes it at this moment (its delay line's own wake-ups included)."""
    times = []
    for _ in range(samples):
        # Made first: a socket of another namespace comes from a thread that enters it, which takes longer
        # than the round trip itself when there is no delay.
        with client.socket() as sock:
            sock.settimeout(10.0)
            started = time.perf_counter()
            sock.connect((server.address, port))
            times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 2)
