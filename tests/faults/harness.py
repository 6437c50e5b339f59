"""A fault run: three real sites, thousands of requests, faults injected while they flow, and an audit.

Site 1 sends; sites 2 and 3 serve ``fault.echo`` and are reached through TCP proxies that can cut the link
or drop answers. Every request goes to both twins 2 and 3 and carries its index as payload. The audit
checks the bus's promise: every (request, destination) gets exactly one final outcome on its return queue,
none is lost, and no service executes a request twice.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.exceptions import RedisError

from testing.local_sites import LocalCluster, wait_until
from tests.support.services import RawService
from tests.support.tcp_proxy import TcpProxy
from wire import keys
from wire.envelope import Envelope, encode_payload

CMD = "fault.echo"
RECEIVERS = (2, 3)
Executions = Callable[[], dict[int, Counter[bytes]]]
# Fast retries and probes so that a run takes seconds, not minutes.
# KEYS: the batch's marker, msgbus.system.local. ARGV: the envelopes.
PUSH_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX') then return redis.call('RPUSH', KEYS[2], unpack(ARGV)) end
return 0
"""
DAEMON_ARGS = ["--retry-delay", "0.1", "--retry-max-delay", "1", "--send-timeout", "3", "--drain-grace", "2"]
# A request's tries: with those delays, about 17 s of re-sends, more than a killed daemon takes to start
# again on a loaded 2-core machine (10 tries, about 7 s, gave up on a receiver that was slower than that).
TRIES = 20


@dataclass
class Report:
    scenario: str
    requests: int
    destinations: int
    outcomes: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    duplicate_outcomes: int = 0
    executed_twice: int = 0
    seconds: float = 0.0
    # Recovery scenarios (tests/faults/test_recovery.py): seconds from the fault's end (the site back, ready)
    # to the last outcome, and other figures of theirs. Left out of the line when not set.
    recovery_s: float | None = None
    details: dict[str, float | int | str] = field(default_factory=dict)

    def tally(self, errors: list[str]) -> None:
        """Count the outcomes one (request, destination) got: their ``err`` texts, in arrival order."""
        if not errors:
            self.lost += 1
            return
        self.duplicate_outcomes += len(errors) - 1
        if errors[0]:
            self.errors[_kind(errors[0])] += 1
        else:
            self.ok += 1

    def line(self) -> str:
        extra: dict[str, object] = {}
        if self.recovery_s is not None:
            extra["recovery_s"] = round(self.recovery_s, 1)
        if self.details:
            extra["details"] = self.details
        return json.dumps(
            {
                "scenario": self.scenario,
                "requests": self.requests,
                "expected_outcomes": self.requests * self.destinations,
                "outcomes": self.outcomes,
                "ok": self.ok,
                "errors": dict(self.errors),
                "lost": self.lost,
                "duplicate_outcomes": self.duplicate_outcomes,
                "executed_twice": self.executed_twice,
                "seconds": round(self.seconds, 1),
                **extra,
            }
        )


class FaultRun:
    def __init__(
        self,
        *,
        daemon_args: tuple[str, ...] = (),
        redis_appendonly: bool = False,
        exp_s: int = 180,
        retries: int = TRIES,
    ) -> None:
        self.exp_s = exp_s
        self.retries = retries
        self.cluster = LocalCluster(
            size=3, extra_args=[*DAEMON_ARGS, *daemon_args], redis_appendonly=redis_appendonly
        ).prepare()
        self.proxies: dict[int, TcpProxy] = {}
        try:
            reserved = frozenset(site.port for site in self.cluster.sites)
            for twin in RECEIVERS:
                site = self.cluster.sites[twin - 1]
                self.proxies[twin] = TcpProxy(("127.0.0.1", site.port), avoid=reserved)
                site.advertised_address = f"127.0.0.1:{self.proxies[twin].port}"
            self.cluster.launch()
        except BaseException:
            self.close()
            raise
        # One return queue for every request, emptied by a reliable pop (BLMOVE) into an archive list that
        # the audit reads at the end: a plain BLPOP can lose the item it popped when Redis shuts down.
        self.ret = str(uuid.uuid4())
        self.archive = keys.processing(self.ret)
        self.outcomes: dict[tuple[int, int], list[str]] = defaultdict(list)
        self._archived = 0
        self._collecting = threading.Event()

    @property
    def sender_redis(self) -> str:
        return self.cluster.redis[0].url

    def site(self, twin: int) -> redis.Redis:
        return redis.Redis.from_url(self.cluster.redis[twin - 1].url)

    def outcome_count(self) -> int:
        """Outcomes received so far (the last known count while the sender's Redis is down)."""
        try:
            with redis.Redis.from_url(self.sender_redis) as conn:
                self._archived = int(conn.llen(self.archive))
        except RedisError:
            pass
        return self._archived

    # --- load --------------------------------------------------------------------------------------------

    def push(self, count: int, batch: int = 100, pause_s: float = 0.02) -> None:
        """Push ``count`` requests to site 1, in batches, riding out a Redis restart: a batch whose answer
        the restart lost is pushed again only if it did not land (a marker per batch, set with the push)."""
        conn = redis.Redis.from_url(self.sender_redis)
        push_once = conn.register_script(PUSH_ONCE)
        index = 0
        while index < count:
            envelopes = [
                Envelope(
                    cmd=CMD,
                    dst=RECEIVERS,
                    ret=self.ret,
                    dat=encode_payload(str(i).encode()),
                    exp=self.exp_s,
                    retries=self.retries,
                    now=int(time.time()),
                ).encode()
                for i in range(index, min(index + batch, count))
            ]
            try:
                push_once(keys=[f"{self.ret}.pushed.{index}", keys.LOCAL], args=envelopes)
            except RedisError:
                time.sleep(0.1)
                continue
            index += len(envelopes)
            time.sleep(pause_s)
        conn.close()

    def _collect(self) -> None:
        conn = redis.Redis.from_url(self.sender_redis)
        while self._collecting.is_set():
            try:
                conn.blmove(self.ret, self.archive, 1, "RIGHT", "LEFT")
            except RedisError:
                time.sleep(0.1)
        conn.close()

    def _read_archive(self) -> None:
        with redis.Redis.from_url(self.sender_redis) as conn:
            for raw in conn.lrange(self.archive, 0, -1):
                env = Envelope.decode(raw)
                self.outcomes[(int(env.payload), env.src)].append(env.err)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        self._collecting.set()
        thread = threading.Thread(target=self._collect, daemon=True, name="collector")
        thread.start()
        try:
            yield
        finally:
            self._collecting.clear()
            thread.join(timeout=5)

    # --- the run -----------------------------------------------------------------------------------------

    def run(
        self,
        scenario: str,
        count: int,
        executions: Executions,
        fault: Callable[[FaultRun], None] = lambda run: None,
        timeout_s: float = 240.0,
        push_pause_s: float = 0.02,
    ) -> Report:
        """Push ``count`` requests while ``fault`` acts, wait for every outcome, and audit.

        ``executions`` tells, per receiving twin, how many times its service ran each payload.
        """
        started = time.monotonic()
        expected = count * len(RECEIVERS)
        with self.collecting():
            pusher = threading.Thread(
                target=self.push, args=(count, 100, push_pause_s), daemon=True, name="pusher"
            )
            pusher.start()
            fault(self)
            pusher.join()
            wait_until(lambda: self.outcome_count() >= expected, timeout_s, f"{expected} outcomes")
            elapsed = time.monotonic() - started
            # Anything still to come would be a second outcome: give it a moment to show up.
            time.sleep(1.0)
        report = Report(scenario, count, len(RECEIVERS), seconds=elapsed)
        self._read_archive()
        for index in range(count):
            for twin in RECEIVERS:
                errors = self.outcomes.get((index, twin), [])
                report.outcomes += len(errors)
                report.tally(errors)
        report.executed_twice = sum(
            1 for counted in executions().values() for times in counted.values() if times > 1
        )
        _record(report)
        return report

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        self.cluster.cleanup()


def _kind(err: str) -> str:
    for prefix in ("all retries done", "request timeout", "received invalid message"):
        if err.startswith(prefix):
            return prefix
    return err[:60]


def _record(report: Report) -> None:
    """Append the figures to $MSGBUS_FAULT_REPORT when set (``make faults`` does)."""
    path = os.environ.get("MSGBUS_FAULT_REPORT")
    if path:
        with Path(path).open("a") as out:
            out.write(report.line() + "\n")


@contextmanager
def serving(run: FaultRun, twins: tuple[int, ...] = RECEIVERS) -> Iterator[Executions]:
    """A counting ``fault.echo`` service (two workers) on each of ``twins``; yields their execution counts."""
    workers: dict[int, list[RawService]] = {}
    for twin in twins:
        url = run.cluster.redis[twin - 1].url
        workers[twin] = [RawService(url, CMD) for _ in range(2)]
        for worker in workers[twin]:
            worker.start()

    def executions() -> dict[int, Counter[bytes]]:
        counted: dict[int, Counter[bytes]] = {}
        for twin, group in workers.items():
            counted[twin] = Counter()
            for worker in group:
                counted[twin].update(worker.payloads)
        return counted

    try:
        yield executions
    finally:
        for group in workers.values():
            for worker in group:
                worker.__exit__(None, None, None)
