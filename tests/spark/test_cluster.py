"""The job on a real Spark standalone cluster (a master and a worker started from the installed PySpark)
writes the same tables and summary as a local[*] run on the same input; following the same files there
(``--follow``), it writes the batch job's per-minute tables."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from spark import generate, minutes
from spark.follow import read_table
from spark.jit import C1_ONLY
from spark.job import MineOptions, run
from spark.progress import Progress
from testing.local_sites import wait_until
from testing.spark_cluster import StandaloneCluster
from tests.spark.follow_logs import closed_until
from tests.spark.test_mine import TABLES

REPO = Path(__file__).resolve().parents[2]


def submit(logs: Path, out: Path, master: str, env: dict[str, str]) -> str:
    """The batch job on ``logs`` with spark-submit, its JVMs compiling with C1 alone as docs/mining.md tells
    spark-submit's users to for small inputs; returns what it printed."""
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    c1 = [f"spark.{jvm}.defaultJavaOptions={C1_ONLY}" for jvm in ("driver", "executor")]
    command = [spark_submit, "--master", master, "--driver-memory", "1g", "--conf", c1[0], "--conf", c1[1]]
    command += ["spark/mine.py", "--events", str(logs / "events"), "--backlog", str(logs / "backlog")]
    command += ["--out", str(out)]
    env = env | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # spark-submit passes the driver's stderr on through its stdout.
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-5000:]
    return terminal


def follow(events: Path, out: Path, master: str, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """``python -m spark.mine --follow`` on ``events`` until its first micro-batch is done (the files are
    all there: it reads them all), then stopped as by systemd; returns its "now" view and what it printed."""
    command = [sys.executable, "-m", "spark.mine", "--follow", "--events", str(events), "--out", str(out)]
    command += ["--master", master, "--trigger", "1", "--driver-memory", "1g"]
    terminal = out.parent / "follow.log"
    with open(terminal, "wb") as log, subprocess.Popen(command, cwd=REPO, env=env, stderr=log) as job:
        try:
            wait_until(
                lambda: job.poll() is not None or (out / "now.json").exists(),
                timeout_s=240,
                what="the stream's first micro-batch",
            )
            assert job.poll() is None, terminal.read_text()[-5000:]
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=90)
        finally:
            job.kill()
    assert job.returncode == 0, terminal.read_text()[-5000:]
    return read_now(out), terminal.read_text()


def read_now(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "now.json").read_text()))


# Three jobs: one in this process's session, two on a cluster of four JVMs each (a master, a worker, the
# driver, its executor): on a loaded 2-core machine this takes about three minutes.
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_standalone_cluster_writes_the_tables_of_a_local_run_in_a_batch_and_following(
    spark: SparkSession, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    argv = ["--events", "4000", "--sites", "3", "--hosts", "2", "--hours", "2", "--out", str(logs)]
    assert (
        generate.main([*argv, "--backlog-entries", "200", "--malformed-rate", "0.005", "--workers", "1"]) == 0
    )
    # The local run in this process's session: a job in a JVM of its own would cost another JVM's start.
    local = tmp_path / "local"
    terminal = io.StringIO()
    options = MineOptions(
        events=[str(logs / "events")], backlog=[str(logs / "backlog")], out=str(local), shuffle_partitions=3
    )
    run(spark, options, Progress(terminal))
    assert "plan: 3 shuffle partitions" in terminal.getvalue()

    clustered = tmp_path / "cluster"
    # One core more than this machine has: the job must see the worker's cores, not Spark's 2 of before an
    # executor registered, and the tables must not depend on the partitioning.
    with StandaloneCluster(cores=3, memory="2g") as cluster:
        printed = submit(logs, clustered, cluster.url, cluster.client_env())
        assert "read events: " in printed and "done in " in printed
        # spark-submit's flags decide, as the running JVM says.
        assert f"start Spark: master {cluster.url}, 3 cores, driver with C1 alone" in printed
        assert "plan: 3 shuffle partitions" in printed
        wait_until(
            lambda: [app["name"] for app in cluster.completed_apps()] == ["msgbus-mine"],
            what="the master to list the job as completed",
        )
        assert cluster.completed_apps()[0]["state"] == "FINISHED"
        # The executor the worker started took spark-submit's options.
        executors = [log.read_text().splitlines()[0] for log in cluster.workdir.glob("work/app-*/*/stderr")]
        assert executors and all(f'"{C1_ONLY}"' in line for line in executors)

        # A stream's executors keep C2 for its days of running (spark.jit); for one micro-batch C1 alone costs
        # a third of what C2 does.
        with open(cluster.conf_dir / "spark-defaults.conf", "a") as defaults:
            defaults.write(f"spark.executor.defaultJavaOptions {C1_ONLY}\n")
        now, printed = follow(logs / "events", tmp_path / "followed", cluster.url, cluster.client_env())
        # Started by itself, the job chose the driver's compilers: C1 alone, as it only plans.
        assert f"start Spark: master {cluster.url}, 3 cores, driver with C1 alone" in printed
        wait_until(
            lambda: len(cluster.completed_apps()) == 2, what="the master to list the stream as completed"
        )

    # The stream on the cluster read every line once, and wrote the batch job's per-minute tables for the
    # minutes it closed.
    lines = sum(len(path.read_bytes().splitlines()) for path in (logs / "events").glob("*.jsonl"))
    assert now["progress"]["lines"] == lines and now["progress"]["malformed"]
    before = F.col(minutes.MINUTE) < F.timestamp_micros(F.lit(closed_until(now)))
    for table in minutes.TABLES:
        expected = spark.read.parquet(str(clustered / table)).where(before)
        assert expected.count() > 0
        assertDataFrameEqual(read_table(spark, str(tmp_path / "followed"), table), expected)

    for table in sorted(TABLES):
        expected = spark.read.parquet(str(local / table))
        assertDataFrameEqual(spark.read.parquet(str(clustered / table)), expected)
    summary = (clustered / "summary.md").read_text().replace(str(clustered), "OUT")
    assert summary == (local / "summary.md").read_text().replace(str(local), "OUT")
    assert "## Latency by command" in summary
