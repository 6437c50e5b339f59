"""Recovery runs: two real sites with the daemons' default retry settings, a fault, and how soon the bus
catches up once the fault is over.

Site 1 sends to ``fault.echo`` on twin 2, whose counting service keeps running whatever happens to the
daemons. A collector moves every outcome out of the caller's return list (reliable pop, like the fault
harness) and notes when the last one came. The audit is the harness's: one outcome per request, a reply
and not an error, each payload executed once by the service.

Also here: starting a daemon without waiting for its ready line (a supervisor that restarts what it killed,
as systemd's ``Restart=always`` does), reading a daemon's ``/metrics``, and a peer that is alive but answers
every request with HTTP 500.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from redis.exceptions import RedisError

from testing.local_sites import READY_LINE, LocalCluster, SiteProcess, wait_until
from tests.faults.harness import CMD, Report, _record
from tests.support.services import RawService
from tests.support.tcp_proxy import TcpProxy
from wire import keys
from wire.envelope import Envelope, encode_payload

SENDER = 1
RECEIVER = 2
TRIES = 8
# After the last expected outcome, anything more that shows up in the return list is a second outcome.
SETTLE_S = 1.0


class RecoveryRun:
    """Two sites started with ``daemon_args`` and nothing else (default retry delays and timeouts).

    With ``twin_2_via``, the twin map sends site 1 to twin 2 through a :class:`TcpProxy` (``proxy``) that
    forwards to that address; :meth:`TcpProxy.retarget` then points it at site 2 itself (for connections made
    from then on).
    """

    def __init__(self, *, daemon_args: Sequence[str] = (), twin_2_via: tuple[str, int] | None = None) -> None:
        self.ret = str(uuid.uuid4())
        self.archive = keys.processing(self.ret)
        self.last_arrival: float | None = None
        self.proxy: TcpProxy | None = None
        self.services: list[RawService] = []
        self._collecting = threading.Event()
        self._collector = threading.Thread(target=self._collect, daemon=True, name="collector")
        self.cluster = LocalCluster(size=2, extra_args=list(daemon_args)).prepare()
        # One client (a thread-safe pool) for the pushes, the polls and the collector's blocking moves.
        self.sender = redis.Redis.from_url(self.cluster.redis[SENDER - 1].url)
        try:
            if twin_2_via is not None:
                reserved = frozenset(site.port for site in self.cluster.sites) | {twin_2_via[1]}
                self.proxy = TcpProxy(twin_2_via, avoid=reserved)
                self.cluster.sites[RECEIVER - 1].advertised_address = f"127.0.0.1:{self.proxy.port}"
            self.cluster.launch()
            self.services = [RawService(self.cluster.redis[RECEIVER - 1].url, CMD) for _ in range(2)]
            for service in self.services:
                service.start()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RecoveryRun:
        self._collecting.set()
        self._collector.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._collecting.clear()
        if self._collector.is_alive():
            self._collector.join(timeout=5)
        for service in self.services:
            service.__exit__(None, None, None)
        self.sender.close()
        if self.proxy is not None:
            self.proxy.close()
        self.cluster.cleanup()

    @property
    def sites(self) -> list[SiteProcess]:
        return self.cluster.sites

    # --- load ----------------------------------------------------------------------------------------

    def push(self, first: int, count: int, *, exp_s: int) -> None:
        """RPUSH requests ``first`` .. ``first + count - 1`` (the index is the payload) onto site 1's local
        queue, ``try`` 8, for twin 2."""
        now = int(time.time())
        envelopes = [
            Envelope(
                cmd=CMD,
                dst=(RECEIVER,),
                ret=self.ret,
                dat=encode_payload(str(index).encode()),
                exp=exp_s,
                retries=TRIES,
                now=now,
            ).encode()
            for index in range(first, first + count)
        ]
        for start in range(0, len(envelopes), 500):
            self.sender.rpush(keys.LOCAL, *envelopes[start : start + 500])

    def push_steadily(self, count: int, over_s: float, *, exp_s: int, batch: int = 10) -> None:
        """Push ``count`` requests in batches spread evenly over ``over_s`` seconds."""
        started = time.monotonic()
        batches = range(0, count, batch)
        pace = threading.Event()  # never set: waits until each batch's time
        for number, first in enumerate(batches):
            pace.wait(max(0.0, started + number * over_s / len(batches) - time.monotonic()))
            self.push(first, min(batch, count - first), exp_s=exp_s)

    def local_queue_length(self) -> int:
        """Requests on site 1's ``msgbus.system.local`` that its daemon has not taken yet."""
        return int(self.sender.llen(keys.LOCAL))

    # --- outcomes ------------------------------------------------------------------------------------

    def _collect(self) -> None:
        # BLMOVE into an archive list, read at the end, as the fault harness does; the time of each move
        # is when the caller had its outcome.
        while self._collecting.is_set():
            try:
                moved = self.sender.blmove(self.ret, self.archive, 1, "RIGHT", "LEFT")
            except RedisError:
                time.sleep(0.1)  # site 1's Redis is not part of these faults; should it hiccup, try again
                continue
            if moved is not None:
                self.last_arrival = time.monotonic()

    def outcome_count(self) -> int:
        return int(self.sender.llen(self.archive))

    def wait_for_outcomes(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` outcomes have come, at most ``timeout_s``; False if they did not."""
        try:
            wait_until(lambda: self.outcome_count() >= count, timeout_s, f"{count} outcomes")
        except TimeoutError:
            return False
        return True

    def audit(self, scenario: str, count: int, *, started: float, recovered_at: float) -> Report:
        """Wait :data:`SETTLE_S` for outcomes beyond the expected ones, then count everything into a
        report, for the caller to complete and :func:`record`. ``started`` and ``recovered_at`` are
        monotonic times: the fault's start and the moment it was over (the site back and ready)."""
        expected_all = self.outcome_count() >= count
        threading.Event().wait(SETTLE_S)
        self._collecting.clear()
        self._collector.join(timeout=5)
        raw = [*self.sender.lrange(self.archive, 0, -1), *self.sender.lrange(self.ret, 0, -1)]
        report = Report(scenario, count, 1)
        outcomes: dict[int, list[str]] = {}
        foreign = 0
        for item in raw:
            env = Envelope.decode(item)
            index = int(env.payload) if env.payload.isdigit() else -1
            if env.src != RECEIVER or not 0 <= index < count:
                foreign += 1
                continue
            outcomes.setdefault(index, []).append(env.err)
        report.outcomes = len(raw)
        for index in range(count):
            report.tally(outcomes.get(index, []))
        executed = self.executions()
        report.executed_twice = sum(1 for times in executed.values() if times > 1)
        report.details["not_executed"] = sum(1 for index in range(count) if not executed[str(index).encode()])
        if foreign:
            report.details["foreign_outcomes"] = foreign
        if self.last_arrival is not None:
            report.seconds = self.last_arrival - started
            if expected_all:
                report.recovery_s = self.last_arrival - recovered_at
        return report

    def executions(self) -> Counter[bytes]:
        """How many times the service on twin 2 ran each payload."""
        counted: Counter[bytes] = Counter()
        for service in self.services:
            counted.update(service.payloads)
        return counted


def record(report: Report) -> None:
    """Append the figures to $MSGBUS_FAULT_REPORT when set, as the fault harness does (``make faults``)."""
    _record(report)


def broken_promises(report: Report) -> list[str]:
    """What the run did wrong against "every request answered with its reply, once, executed once"."""
    problems = []
    if report.lost:
        problems.append(f"{report.lost} requests got no outcome")
    if report.errors:
        problems.append(f"{sum(report.errors.values())} requests got an error: {dict(report.errors)}")
    if report.duplicate_outcomes:
        problems.append(f"{report.duplicate_outcomes} second outcomes")
    if report.details.get("foreign_outcomes"):
        problems.append(f"{report.details['foreign_outcomes']} outcomes that answer no request of the run")
    if report.executed_twice:
        problems.append(f"{report.executed_twice} requests executed twice by the service")
    if report.details.get("not_executed"):
        problems.append(f"{report.details['not_executed']} requests never executed by the service")
    return problems


# --- daemons that are restarted without waiting ------------------------------------------------------


def spawn_daemon(site: SiteProcess) -> int:
    """Start ``site``'s msgbusd as :meth:`SiteProcess.start` does, without waiting for it to be ready;
    returns the offset in its log where this process's lines begin (see :func:`daemon_ready`)."""
    assert site.log_path is not None, "the cluster gives every site a log file"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["MSGBUS_MNEMONICS"] = site.mnemonic
    with open(site.log_path, "ab") as log_file:
        offset = log_file.tell()
        site.process = subprocess.Popen(site.command(), stdout=log_file, stderr=subprocess.STDOUT, env=env)
    return offset


def daemon_ready(site: SiteProcess, offset: int) -> bool:
    """True once the daemon started at log ``offset`` said it is ready; raises if it exited by itself."""
    if site.process is not None and site.process.poll() is not None:
        raise RuntimeError(
            f"msgbusd twin {site.twin} exited by itself with {site.process.returncode}; its log ends:\n"
            f"{site.log()[-3000:]}"
        )
    assert site.log_path is not None
    with open(site.log_path, "rb") as log_file:
        log_file.seek(offset)
        return READY_LINE.encode() in log_file.read()


@dataclass(frozen=True)
class Kill:
    at_s: float  # from the start of the chaos
    twin: int


def kill_schedule(
    rng: random.Random, twins: Sequence[int], duration_s: float, gap_s: tuple[float, float]
) -> list[Kill]:
    """Kills at random gaps in ``gap_s`` (each of a random twin) for ``duration_s``: drawn up front, so a seed
    gives the same schedule whatever the timing of the run."""
    schedule = []
    at_s = rng.uniform(*gap_s)
    while at_s < duration_s:
        schedule.append(Kill(at_s, rng.choice(twins)))
        at_s += rng.uniform(*gap_s)
    return schedule


@dataclass
class Supervisor:
    """kill -9 a site's daemon and start it again at once, without waiting for its ready line (as systemd's
    ``Restart=always`` would); notes daemons found dead by themselves when their turn came."""

    sites: Sequence[SiteProcess]
    kills: Counter[int] = field(default_factory=Counter)
    exited_by_themselves: list[str] = field(default_factory=list)
    last_kill: float | None = None
    # Where each site's current process begins in its log (its ready line comes after that).
    _offsets: dict[int, int] = field(default_factory=dict)

    def site(self, twin: int) -> SiteProcess:
        return next(site for site in self.sites if site.twin == twin)

    def kill_and_restart(self, twin: int) -> None:
        site = self.site(twin)
        if site.process is not None and site.process.poll() is not None:
            self.exited_by_themselves.append(f"twin {twin} (status {site.process.returncode})")
        site.kill()
        self.last_kill = time.monotonic()
        self.kills[twin] += 1
        self._offsets[twin] = spawn_daemon(site)

    def play(self, schedule: Sequence[Kill]) -> None:
        started = time.monotonic()
        pace = threading.Event()  # never set: waits until each kill's time
        for kill in schedule:
            pace.wait(max(0.0, started + kill.at_s - time.monotonic()))
            self.kill_and_restart(kill.twin)

    def wait_all_ready(self, timeout_s: float) -> None:
        for site in self.sites:
            ready = partial(daemon_ready, site, self._offsets.get(site.twin, 0))
            wait_until(ready, timeout_s, f"msgbusd twin {site.twin} to be ready")


def log_lines(site: SiteProcess, *needles: str) -> list[str]:
    """The lines of ``site``'s daemon log (all its runs) that contain one of ``needles``."""
    return [line for line in site.log().splitlines() if any(needle in line for needle in needles)]


# --- a peer that is alive and refuses everything ------------------------------------------------------


class RefusingPeer:
    """A real HTTP server that answers every request with HTTP 500: a site that is there and refuses the
    message (not "down", as no connection, a timeout or 502/503/504 would be), closing the connection after
    each answer. It notes the uid of every envelope it is sent, whether one per request or several in a
    batch."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.first_refusal: float | None = None
        self.last_first_refusal: float | None = None
        self._lock = threading.Lock()
        self._server = _RefusingServer(("127.0.0.1", 0), _Refuse)
        self._server.peer = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="refusing peer")

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", int(self._server.server_address[1])

    def distinct_uids(self) -> int:
        with self._lock:
            return len(self.seen)

    def refused_twice(self) -> int:
        """Envelopes it was sent more than once."""
        with self._lock:
            return sum(1 for times in self.seen.values() if times > 1)

    def note(self, body: bytes) -> None:
        try:
            uids = list(_uids(json.loads(body)))
        except ValueError:
            return
        now = time.monotonic()
        with self._lock:
            fresh = [uid for uid in uids if uid not in self.seen]
            self.seen.update(uids)
            if fresh:
                self.first_refusal = self.first_refusal or now
                self.last_first_refusal = now

    def __enter__(self) -> RefusingPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


REFUSAL = json.dumps({"Status": "error", "Message": "the test's failing peer refuses everything"}).encode()


class _RefusingServer(ThreadingHTTPServer):
    request_queue_size = 128
    peer: RefusingPeer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection the proxy broke; nothing to report


class _Refuse(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RefusingServer

    def do_POST(self) -> None:
        self.server.peer.note(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(500)
        # No keep-alive: every request makes a new connection through the proxy, so once the proxy points at
        # the real site nothing more reaches this server, and nothing has to be cut mid-answer (a cut
        # connection would be "peer down" to the sender, which this peer is meant not to be).
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(REFUSAL)))
        self.end_headers()
        self.wfile.write(REFUSAL)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _uids(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("uid"), str):
            yield value["uid"]
        for inner in value.values():
            yield from _uids(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _uids(inner)
