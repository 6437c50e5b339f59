"""The job on a real Spark standalone cluster (a master and a worker started from the installed PySpark)
writes the same tables and summary as a local[*] run on the same input."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark import generate
from spark.jit import C1_ONLY
from spark.job import MineOptions, run
from spark.progress import Progress
from testing.local_sites import wait_until
from testing.spark_cluster import StandaloneCluster
from tests.spark.test_mine import TABLES

REPO = Path(__file__).resolve().parents[2]


def mine(logs: Path, out: Path, master: str, env: dict[str, str]) -> str:
    """``python -m spark.mine`` on ``logs``; returns what it printed."""
    command = [sys.executable, "-m", "spark.mine", "--events", str(logs / "events")]
    command += ["--backlog", str(logs / "backlog"), "--out", str(out), "--master", master]
    command += ["--driver-memory", "1g"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    return done.stderr


# Two jobs, one in this process's session, one on a cluster of four JVMs (a master, a worker, the driver,
# its executor): on a loaded 2-core machine this takes about two minutes.
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_standalone_cluster_writes_the_tables_of_a_local_run(spark: SparkSession, tmp_path: Path) -> None:
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
        terminal = mine(logs, clustered, cluster.url, cluster.client_env())
        assert f"start Spark: master {cluster.url}, 3 cores, driver with C1 alone" in terminal
        assert "plan: 3 shuffle partitions" in terminal
        wait_until(
            lambda: [app["name"] for app in cluster.completed_apps()] == ["msgbus-mine"],
            what="the master to list the job as completed",
        )
        assert cluster.completed_apps()[0]["state"] == "FINISHED"
        # A small input: the executor the worker started compiled with C1 alone (spark.jit).
        commands = [log.read_text().splitlines()[0] for log in cluster.workdir.glob("work/app-*/*/stderr")]
        assert commands and all(
            line.startswith("Spark Executor Command:") and f'"{C1_ONLY}"' in line for line in commands
        )

    for table in sorted(TABLES):
        expected = spark.read.parquet(str(local / table))
        assertDataFrameEqual(spark.read.parquet(str(clustered / table)), expected)
    summary = (clustered / "summary.md").read_text().replace(str(clustered), "OUT")
    assert summary == (local / "summary.md").read_text().replace(str(local), "OUT")
    assert "## Latency by command" in summary
