"""Requests flowing between msgbus sites of a network test bed while a fault acts on the network, and the
audit of what came back.

A :class:`Flow` is the requests one site sends to one twin's service, each carrying its number in its uid
and payload, all on one return queue that a collector thread empties, noting when each outcome came. A
:class:`Pacer` pushes on flows at a steady rate. :func:`audit` turns flows into the fault harness's
:class:`~tests.faults.harness.Report` (so ``make faults`` tables them too) and lists the broken promises:
lost, answered twice, executed twice, an error, an answer later than allowed after the heal.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime

import redis

from testing.local_sites import wait_until
from testing.netbed import BedSite
from tests.faults.harness import Report, _record
from tests.faults.recovery import broken_promises
from tests.support.services import RawService
from wire import keys
from wire.envelope import Envelope, encode_payload

ECHO = "net.echo"
# Requests live long enough to outlast any outage here; a request that runs out of time is a failure of
# the scenario, not an outcome to expect.
EXP_S = 180
TRIES = 10
# Once every request has its outcome, how long the sites may take to finish what they were doing (acks,
# forgetting what was sent).
IDLE_WAIT_S = 10.0
# How often the collector gives up its blocking pop to look whether it should stop.
POP_SLICE_S = 0.2


@dataclass
class Sent:
    pushed_at: float
    size: int
    digest: bytes


@dataclass
class Outcome:
    at: float
    err: str
    intact: bool


def _number(reply: Envelope) -> int:
    """The number of the request ``reply`` answers: an echo opens with it, and an error from a daemon carries
    the request's uid (a service's reply need not)."""
    try:
        head, colon, _ = reply.payload.partition(b":")
    except ValueError:
        head = colon = b""
    if colon and head.isdigit():
        return int(head)
    return int(reply.uid) if reply.uid.isdigit() else -1


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class Flow:
    """Requests from ``caller``'s site to ``cmd`` at ``callee``'s, numbered from 0 (the number is the
    request's uid and opens its payload), answered on one return queue."""

    def __init__(
        self,
        caller: BedSite,
        callee: BedSite,
        *,
        name: str,
        cmd: str = ECHO,
        exp_s: int = EXP_S,
        tries: int = TRIES,
    ) -> None:
        self.caller = caller
        self.callee = callee
        self.name = name
        self.cmd = cmd
        self.exp_s = exp_s
        self.tries = tries
        self.ret = f"net.{name}.{uuid.uuid4().hex[:8]}"
        self.began = time.time()
        self.sent: dict[int, Sent] = {}
        self.outcomes: dict[int, list[Outcome]] = {}
        self.foreign = 0
        self._conn = redis.Redis.from_url(caller.redis_url)
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._collector = threading.Thread(target=self._collect, daemon=True, name=f"collector {name}")

    def __enter__(self) -> Flow:
        self._running.set()
        self._collector.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running.clear()
        self._collector.join(timeout=5)
        self._conn.close()

    def push(self, size: int = 0) -> int:
        """Push the next request (a payload of about ``size`` bytes) onto the caller's local queue; returns
        its number."""
        with self._lock:
            index = len(self.sent)
            payload = b"%d:" % index + b"x" * size
            self.sent[index] = Sent(time.monotonic(), len(payload), _digest(payload))
        envelope = Envelope(
            uid=str(index),
            cmd=self.cmd,
            exp=self.exp_s,
            retries=self.tries,
            dat=encode_payload(payload),
            dst=(self.callee.twin,),
            ret=self.ret,
            now=int(time.time()),
        )
        self._conn.rpush(keys.LOCAL, envelope.encode())
        return index

    def _collect(self) -> None:
        while self._running.is_set():
            item = self._conn.blpop([self.ret], timeout=POP_SLICE_S)
            if item is None:
                continue
            at = time.monotonic()
            reply = Envelope.decode(item[1])
            with self._lock:
                sent = self.sent.get(index := _number(reply))
                if sent is None:
                    self.foreign += 1
                    continue
                intact = bool(reply.err) or _digest(reply.payload) == sent.digest
                self.outcomes.setdefault(index, []).append(Outcome(at, reply.err, intact))

    @property
    def pushed(self) -> int:
        return len(self.sent)

    def answered(self) -> int:
        """Requests that have an outcome."""
        with self._lock:
            return len(self.outcomes)

    def done(self) -> bool:
        with self._lock:
            return len(self.outcomes) == len(self.sent)

    def outcome(self, index: int) -> Outcome | None:
        """The first outcome of request ``index``, if it came."""
        with self._lock:
            found = self.outcomes.get(index)
            return found[0] if found else None

    def latencies(self, pushed_between: tuple[float, float] = (0.0, float("inf"))) -> list[float]:
        """Seconds from push to first outcome of the answered requests pushed in that (monotonic) window."""
        low, high = pushed_between
        with self._lock:
            return [
                found[0].at - self.sent[index].pushed_at
                for index, found in self.outcomes.items()
                if low <= self.sent[index].pushed_at <= high
            ]


def wait_answered(flows: Sequence[Flow], count: int, timeout_s: float) -> None:
    """Wait until each of ``flows`` has ``count`` outcomes (traffic is flowing)."""
    wait_until(
        lambda: all(flow.answered() >= count for flow in flows), timeout_s, f"{count} answers per flow"
    )


def wait_done(flows: Sequence[Flow], timeout_s: float) -> bool:
    """Wait until every request of ``flows`` has an outcome, at most ``timeout_s``; False if not."""
    try:
        wait_until(lambda: all(flow.done() for flow in flows), timeout_s, "an outcome for every request")
    except TimeoutError:
        return False
    return True


class Pacer:
    """Pushes one request on each of ``flows``, ``per_s`` times a second, from a thread, while entered."""

    def __init__(self, flows: Sequence[Flow], per_s: float, size: int = 0) -> None:
        self.flows = list(flows)
        self.gap_s = 1.0 / per_s
        self.size = size
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pacer")

    def __enter__(self) -> Pacer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            for flow in self.flows:
                flow.push(self.size)
            self.rounds += 1
            self._stop.wait(max(0.0, started + self.rounds * self.gap_s - time.monotonic()))

    def wait_rounds(self, more: int, timeout_s: float) -> None:
        """Wait until ``more`` rounds more than now have been pushed."""
        target = self.rounds + more
        wait_until(lambda: self.rounds >= target, timeout_s, f"{more} more rounds of requests")


@contextmanager
def serving(sites: Iterable[BedSite], cmd: str = ECHO) -> Iterator[list[RawService]]:
    """A counting echo service for ``cmd`` on each of ``sites``."""
    services = [RawService(site.redis_url, cmd) for site in sites]
    for service in services:
        service.start()
    try:
        yield services
    finally:
        for service in services:
            service.__exit__(None, None, None)


def executed_twice(services: Iterable[RawService]) -> int:
    """Requests (source twin and uid) a service ran more than once."""
    return sum(1 for service in services for times in service.executions.values() if times > 1)


# Keys that hold work a site has still to do for a message: while any is there, a request may still be sent
# (again) or a reply forwarded (again).
_WORK = (keys.LOCAL, keys.REMOTE, keys.REPLY, keys.BACKLOG, keys.OUTBOX, keys.REPLIES)


def work_left(site: BedSite) -> list[str]:
    """The keys of ``site``'s Redis that hold work still to do: nothing to send, re-send or deliver when
    empty."""
    with redis.Redis.from_url(site.redis_url) as conn:
        found = [key for key in _WORK if conn.exists(key)]
        found += sorted(
            key.decode() for key in conn.scan_iter(match=f"{keys.SEND_QUEUE_PREFIX}*", count=1000)
        )
    return found


def wait_idle(sites: Iterable[BedSite], timeout_s: float) -> dict[int, list[str]]:
    """Wait until ``sites`` have no work left (then no second outcome nor second execution can come), at
    most ``timeout_s``; returns what is left, by twin (empty once they are idle)."""
    chosen = list(sites)
    with suppress(TimeoutError):
        wait_until(lambda: not any(work_left(site) for site in chosen), timeout_s, "the sites to be idle")
    return {site.twin: left for site in chosen if (left := work_left(site))}


def percentile(values: Sequence[float], share: float) -> float:
    """The value below which ``share`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def spread(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of ``values``, in seconds, rounded for a report."""
    if not values:
        return {}
    return {
        "p50_s": round(statistics.median(values), 2),
        "p99_s": round(percentile(values, 0.99), 2),
        "max_s": round(max(values), 2),
    }


@dataclass
class Audit:
    """A scenario's report and what it did wrong."""

    report: Report
    problems: list[str] = field(default_factory=list)

    def check(self, sites: Sequence[BedSite] = (), *, since: float = 0.0) -> None:
        """Record and print the figures; fail with every problem at once, and then with the warnings the
        daemons of ``sites`` logged since ``since``."""
        _record(self.report)
        print(self.report.line())
        if self.problems:
            self.problems += [troubles(site, since=since) for site in sites]
        assert not self.problems, "; ".join(self.problems) + "\n" + self.report.line()


def audit(
    scenario: str,
    flows: Sequence[Flow],
    services: Iterable[RawService],
    *,
    started: float,
    healed_at: float | None = None,
    limit_after_heal_s: float | None = None,
    idle_within_s: float = IDLE_WAIT_S,
) -> Audit:
    """Count every flow's outcomes into a report and list the broken promises, once the sites of the flows
    have no work left (at most ``idle_within_s``; work still left is a problem too). With ``healed_at``,
    the figures say how long after the heal the last answer came (``recovery_s``) and the longest any
    request waited after the heal or its push, whichever was later (over ``limit_after_heal_s`` is a
    problem), and how many requests pushed before the heal were answered after it."""
    problems: list[str] = []
    sites = {flow.caller.twin: flow.caller for flow in flows} | {
        flow.callee.twin: flow.callee for flow in flows
    }
    if all(flow.done() for flow in flows):
        left = wait_idle(sites.values(), idle_within_s)
        if left:
            problems.append(f"work left {idle_within_s:g} s after the last outcome: {left}")
    report = Report(scenario, sum(flow.pushed for flow in flows), 1)
    arrivals: list[float] = []
    worst_after_heal = 0.0
    waited_out = 0
    damaged = foreign = 0
    for flow in flows:
        foreign += flow.foreign
        for index, sent in flow.sent.items():
            found = flow.outcomes.get(index, [])
            report.outcomes += len(found)
            report.tally([outcome.err for outcome in found])
            if not found:
                continue
            first = found[0]
            arrivals.append(first.at)
            damaged += sum(1 for outcome in found if not outcome.intact)
            if healed_at is not None:
                worst_after_heal = max(worst_after_heal, first.at - max(sent.pushed_at, healed_at))
                waited_out += sent.pushed_at < healed_at <= first.at
    report.executed_twice = executed_twice(services)
    if arrivals:
        report.seconds = max(arrivals) - started
    if healed_at is not None and arrivals and not report.lost:
        report.recovery_s = max(0.0, max(arrivals) - healed_at)
        report.details["worst_wait_after_heal_s"] = round(worst_after_heal, 2)
        report.details["answered_after_heal"] = waited_out
    latencies = [latency for flow in flows for latency in flow.latencies()]
    report.details.update(spread(latencies))
    # Not a broken promise, but worth a look: the daemons' own errors while the scenario ran.
    began = min(flow.began for flow in flows)
    logged = [line.msg for site in sites.values() for line in errors_logged(site, since=began)]
    if logged:
        report.details["daemon_errors"] = len(logged)
        report.details["first_daemon_error"] = logged[0][:200]
    if foreign:
        report.details["foreign_outcomes"] = foreign
    problems += broken_promises(report)
    if damaged:
        problems.append(f"{damaged} replies whose payload is not the request's")
    if limit_after_heal_s is not None and worst_after_heal > limit_after_heal_s:
        problems.append(
            f"a request waited {worst_after_heal:.1f} s after the heal for its answer "
            f"(limit {limit_after_heal_s:g} s)"
        )
    return Audit(report, problems)


# --- what the daemons logged -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    at: float  # unix time
    level: str
    msg: str


def log_lines(site: BedSite, *, containing: str = "", since: float = 0.0) -> list[LogLine]:
    """The daemon's log lines (its JSON lines) whose message contains ``containing``, logged at or after
    unix time ``since``."""
    found = []
    for raw in site.log().splitlines():
        try:
            line = json.loads(raw)
            at = datetime.fromisoformat(line["ts"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        msg = str(line.get("msg", ""))
        if at >= since and containing in msg:
            found.append(LogLine(at, str(line.get("level", "")), msg))
    return found


def errors_logged(site: BedSite, *, since: float) -> list[LogLine]:
    """The daemon's error lines since unix time ``since``."""
    return [line for line in log_lines(site, since=since) if line.level in ("ERROR", "CRITICAL")]


def troubles(site: BedSite, *, since: float = 0.0, most: int = 12) -> str:
    """The daemon's warnings and errors since ``since`` (the last ``most`` of them, and how many of each
    kind), for a failure's message."""
    lines = [line for line in log_lines(site, since=since) if line.level in ("WARNING", "ERROR", "CRITICAL")]
    kinds = Counter(line.msg[:70] for line in lines)
    shown = "\n    ".join(f"{line.level} {line.msg}" for line in lines[-most:])
    common = "; ".join(f"{count}x {kind}" for kind, count in kinds.most_common(5))
    return f"twin {site.twin}: {len(lines)} warnings ({common})\n    {shown}"
