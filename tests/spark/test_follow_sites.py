"""``msgbus mine --follow`` killed with -9 (it and its JVM) in the middle of its work, then started again on
the same checkpoint: no minute counted twice, none lost: its per-minute tables equal the batch job's over the
same files. Then stopped with SIGTERM, it exits cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark import minutes
from spark.follow import read_table
from testing.local_sites import wait_until
from tests.spark.follow_logs import MINUTE, START, batch_tables, closed_until, traffic, write_log

REPO = Path(__file__).resolve().parents[2]
# The job keeps C2 for its days of running; for the few micro-batches here C1 alone costs less (spark.jit).
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
# Two JVMs of their own, one after the other, and the batch job's in this process: a few minutes when the
# machine is busy.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
WAIT_S = 300.0


class FollowProcess:
    def __init__(self, logs: Path, out: Path) -> None:
        command = [sys.executable, "-m", "spark.mine", "--follow", "--events", str(logs), "--out", str(out)]
        command += [
            "--trigger",
            "1",
            "--watermark",
            "60",
            "--driver-memory",
            "1g",
            "--shuffle-partitions",
            "2",
        ]
        self.log = out.parent / f"follow-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            # A session of its own: killed, it goes with its JVM, as on a crash of the machine.
            self.process = subprocess.Popen(
                command,
                cwd=REPO,
                env=os.environ | {"JAVA_TOOL_OPTIONS": C1_ONLY},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "logs").mkdir()
    yield tmp_path


def batches_done(out: Path) -> int:
    """How many micro-batches have finished their work (their state saved)."""
    state = out / "follow_state"
    return len(list(state.glob("batch=*/_SUCCESS"))) if state.exists() else 0


def test_killed_mid_work_and_started_again_it_neither_loses_nor_doubles_a_minute(
    spark: SparkSession, folder: Path
) -> None:
    logs, out = folder / "logs", folder / "out"
    write_log(logs, "a", traffic(0, 6))
    follower = FollowProcess(logs, out)
    try:
        first = f"the first micro-batch:\n{follower.output()[-5000:]}"
        wait_until(lambda: batches_done(out) >= 1, WAIT_S, first)
        write_log(logs, "b", traffic(6, 10))
        # Killed while it works on the second: it read the new file (or is about to) but has not finished.
        wait_until(lambda: (out / "kept_events" / "batch=1").exists(), WAIT_S, "the second micro-batch")
        follower.kill()
        follower = FollowProcess(logs, out)
        write_log(logs, "c", traffic(10, 14))
        done = START + 12 * MINUTE
        wait_until(
            lambda: (out / "now.json").exists() and closed_until_now(out) >= done,
            WAIT_S,
            f"the minutes up to {done} to close:\n{follower.output()[-5000:]}",
        )
        assert follower.stop() == 0, follower.output()[-5000:]
        assert "stopping: the next start on the same checkpoint goes on from here" in follower.output()
    finally:
        if follower.process.poll() is None:
            follower.kill()

    # Three files read, each once: the micro-batch cut short by the kill was done again whole, counted once.
    progress = json.loads((out / "now.json").read_text())["progress"]
    written = sum(len(path.read_text().splitlines()) for path in logs.glob("*.jsonl"))
    assert (progress["batches"], progress["lines"], progress["duplicates"]) == (3, written, 0)
    expected = batch_tables(spark, logs, done)
    for name in minutes.TABLES:
        assertDataFrameEqual(read_table(spark, str(out), name), expected[name])


def closed_until_now(out: Path) -> int:
    return closed_until(json.loads((out / "now.json").read_text()))
