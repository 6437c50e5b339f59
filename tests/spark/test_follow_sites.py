"""``msgbus mine --follow`` beside two real sites that write their event logs under steady traffic, each
calling the other: the service of one destination turns slow halfway, and the job's "now" view names that
destination within a minute; neither the view nor the ``anomalies`` table ever names the other. The job is
killed with -9 (it and its JVM) in the middle of a micro-batch and started again on the same checkpoint:
its per-minute tables equal the batch job's over the same files, no minute counted twice or lost. Stopped
with SIGTERM, it exits cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from spark import minutes
from spark.anomalies import SLOWER
from spark.follow import ANOMALIES, read_table
from testing.local_sites import LocalCluster, wait_until
from tests.spark.follow_logs import batch_tables, closed_until
from tests.support.services import RawService, push_request
from wire import event_schema as ev
from wire.envelope import Envelope

REPO = Path(__file__).resolve().parents[2]
# The job keeps C2 for its days of running; for the few micro-batches here C1 alone costs less (spark.jit).
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROTATE_S = 5
TRIGGER_S = 15
WATERMARK_S = 15  # above the rotation period, with room for a daemon late to rotate on a busy machine
EVERY_S = 1.0  # a request a second each way
# A minute of recent requests judged against the two before: a baseline in little more than a minute.
RULES = ["--recent-minutes", "1", "--baseline-minutes", "2", "--min-recent", "20", "--min-baseline", "15"]
# Each service works 100 ms on a request, so that a loaded machine's stalls (a round trip of a few ms
# stretched to a hundred) do not make a p99 ten times its usual; the one that turns slow then takes 3 s.
SLOWER_FACTOR = 10
SERVICE_S = 0.1
SLOW_SERVICE_S = 3.0
TURNS_SLOW, STAYS_FAST = 1, 2  # the destinations (twins); each is called by the other
WAIT_S = 240.0
BASELINE_S = 75


class FollowProcess:
    def __init__(self, events: Path, out: Path) -> None:
        command = [sys.executable, "-m", "spark.mine", "--follow", "--events", str(events), "--out", str(out)]
        command += ["--trigger", str(TRIGGER_S), "--watermark", str(WATERMARK_S), *RULES]
        command += ["--slower-factor", str(SLOWER_FACTOR)]
        command += ["--driver-memory", "1g", "--shuffle-partitions", "2"]
        self.log = out.parent / f"follow-{time.monotonic_ns()}.log"
        # Added to the options the tests' JVMs may have (make test's archive of Spark's classes).
        jvm_options = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {C1_ONLY}".strip()
        with open(self.log, "wb") as log:
            # A session of its own: killed, it goes with its JVM, as on a crash of the machine.
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=os.environ | {"JAVA_TOOL_OPTIONS": jvm_options},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=90)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Traffic(threading.Thread):
    """A request every EVERY_S from one site to a twin, whatever the answers take; the answers counted."""

    def __init__(self, redis_url: str, dst: int, cmd: str) -> None:
        super().__init__(daemon=True, name=f"traffic to {dst}")
        self.conn = redis.Redis.from_url(redis_url)
        self.dst, self.cmd = dst, cmd
        self.ret = f"traffic-{uuid.uuid4()}"
        self.sent = 0
        self.answers: list[Envelope] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stopping.wait(max(0.0, next_at - time.monotonic())):
            push_request(self.conn, [self.dst], self.cmd, b"x", exp=120, ret=self.ret)
            self.sent += 1
            next_at += EVERY_S
            self._take_answers()

    def _take_answers(self) -> None:
        while items := self.conn.lpop(self.ret, 100):
            self.answers += [Envelope.decode(item) for item in items]

    def finish(self) -> None:
        """Stop sending and wait for every answer."""
        self._stopping.set()
        self.join(timeout=10)
        deadline = time.monotonic() + 30
        while len(self.answers) < self.sent and time.monotonic() < deadline:
            item = self.conn.blpop([self.ret], timeout=0.5)
            if item is not None:
                self.answers.append(Envelope.decode(item[1]))
        self.conn.close()


class SwitchableService:
    """A destination's service on four threads (the slow one takes longer than a request's interval)."""

    def __init__(self, redis_url: str, cmd: str) -> None:
        self.delay_s = SERVICE_S
        self.threads = [RawService(redis_url, cmd, handler=self._answer) for _ in range(4)]

    def _answer(self, data: bytes) -> bytes:
        time.sleep(self.delay_s)
        return data

    def __enter__(self) -> SwitchableService:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.__exit__()


@pytest.fixture
def logged_sites(tmp_path: Path) -> Iterator[LocalCluster]:
    args = ["--event-log", str(tmp_path / "events"), "--event-log-rotate-seconds", str(ROTATE_S)]
    cluster = LocalCluster(size=2, extra_args=args).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def now_view(out: Path) -> dict[str, Any]:
    path = out / "now.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def as_of(view: dict[str, Any]) -> float:
    return datetime.fromisoformat(view["as_of"]).timestamp() if view else 0.0


def flagged(view: dict[str, Any]) -> set[tuple[int, str]]:
    return {(row["dst"], row["cmd"]) for row in view.get("anomalies", []) if row["kind"] == SLOWER}


def batch_in_progress(out: Path) -> int | None:
    """The micro-batch that has kept its events but not yet saved its state, if one has."""

    def numbers(pattern: str) -> set[int]:
        return {int(path.relative_to(out).parts[1].removeprefix("batch=")) for path in out.glob(pattern)}

    kept, saved = numbers("kept_events/batch=*"), numbers("follow_state/batch=*/_SUCCESS")
    return max(kept) if kept and max(kept) not in saved else None


def test_a_service_turned_slow_is_an_anomaly_and_a_killed_job_started_again_counts_each_minute_once(
    spark: SparkSession, logged_sites: LocalCluster, tmp_path: Path
) -> None:
    events, out = tmp_path / "events", tmp_path / "out"
    slow_cmd, fast_cmd = "load.turns_slow", "load.stays_fast"
    with (
        SwitchableService(logged_sites.redis[TURNS_SLOW - 1].url, slow_cmd) as service,
        SwitchableService(logged_sites.redis[STAYS_FAST - 1].url, fast_cmd),
    ):
        to_slow = Traffic(logged_sites.redis[STAYS_FAST - 1].url, TURNS_SLOW, slow_cmd)
        to_fast = Traffic(logged_sites.redis[TURNS_SLOW - 1].url, STAYS_FAST, fast_cmd)
        started = time.time()
        to_slow.start()
        to_fast.start()
        # The job is started late: its first micro-batch reads the baseline whole (fewer micro-batches).
        wait_until(
            lambda: min(len(to_slow.answers), len(to_fast.answers)) >= BASELINE_S - 15,
            BASELINE_S,
            "the first answers",
        )
        follower = FollowProcess(events, out)
        try:
            # The baseline: the minute judged recent and 15 requests before it, read by the job.
            wait_until(
                lambda: as_of(now_view(out)) >= started + BASELINE_S,
                WAIT_S,
                f"the job to read {BASELINE_S} s of traffic:\n{follower.output()[-5000:]}",
            )
            assert flagged(now_view(out)) == set(), "nothing is an anomaly while both are fast"
            service.delay_s = SLOW_SERVICE_S
            turned_slow = time.time()
            wait_until(
                lambda: flagged(now_view(out)) == {(TURNS_SLOW, slow_cmd)},
                60,
                f"the now view to flag {TURNS_SLOW}:\n{now_view(out)}\n{follower.output()[-3000:]}",
            )
            print(f"the now view named the slow destination {time.time() - turned_slow:.1f} s after")
            assert now_view(out)["slowest_destinations"][0]["dst"] == TURNS_SLOW

            # Killed while it works on a micro-batch, then started again on the same checkpoint: it does
            # that micro-batch again.
            wait_until(lambda: batch_in_progress(out) is not None, WAIT_S, "a micro-batch at work")
            cut_short = batch_in_progress(out)
            follower.kill()
            follower = FollowProcess(events, out)
            wait_until(
                lambda: int(now_view(out)["progress"]["batch"]) >= (cut_short or 0),
                WAIT_S,
                f"micro-batch {cut_short} to be done again:\n{follower.output()[-5000:]}",
            )
            assert follower.stop() == 0, follower.output()[-5000:]
            assert "stopping: the next start on the same checkpoint goes on from here" in follower.output()
        finally:
            if follower.process.poll() is None:
                follower.kill()
            to_slow.finish()
            to_fast.finish()
    for traffic in (to_slow, to_fast):
        assert len(traffic.answers) == traffic.sent and all(answer.err == "" for answer in traffic.answers)
    for site in logged_sites.sites:
        assert site.stop() == 0

    view = now_view(out)
    assert view["progress"]["late"] == 0 and view["progress"]["malformed"] == {}
    done = closed_until(view)
    expected = batch_tables(spark, events, done)
    for name in minutes.TABLES:
        assertDataFrameEqual(read_table(spark, str(out), name), expected[name])
    latency = read_table(spark, str(out), minutes.LATENCY)
    keys = (minutes.MINUTE, ev.SRC, ev.DST, ev.CMD, "hop")
    assert latency.groupBy(*keys).count().where("count > 1").count() == 0, "no minute twice"

    assert expected[minutes.LATENCY].count() > 0, "minutes were closed"

    # Nothing of the destination that stayed fast is ever an anomaly (the table's judgement of a slow
    # stretch, minute by minute, is tested on files in test_follow).
    found = read_table(spark, str(out), ANOMALIES)
    assert found.where(F.col(ev.DST) == STAYS_FAST).count() == 0
