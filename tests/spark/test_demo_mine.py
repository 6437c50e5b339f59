"""What an operator does: two real sites write event logs, and the job turns them into a report."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from client.demo import TRAFFIC_REQUESTS
from spark.job import MineOptions, run
from spark.progress import Progress

MSGBUS = [sys.executable, "-c", "from client.cli import main; main()"]


@pytest.mark.slow
# A hang guard: the demo and the job take about two minutes on a loaded 2-core machine.
@pytest.mark.timeout(300)
def test_the_demo_logs_events_that_mine_turns_into_a_report(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    demo = subprocess.run([*MSGBUS, "demo", "--event-log", str(events)], capture_output=True, text=True)
    assert demo.returncode == 0, demo.stderr
    assert f"msgbus mine --events '{events}/*.jsonl'" in demo.stdout
    assert sorted(path.name.split("-")[1] for path in events.glob("events-*.jsonl")) == ["1", "2"]

    # The job in this process's session (its command lines run in the cluster test).
    out = tmp_path / "report"
    terminal = io.StringIO()
    run(spark, MineOptions(events=[f"{events}/*.jsonl"], backlog=[], out=str(out)), Progress(terminal))
    assert re.search(r"read events: ([\d,]+) lines, \1 kept, 0 malformed", terminal.getvalue())
    assert (out / "report.html").stat().st_size > 10_000, "the report embeds its charts"
    assert "# msgbus event log mining" in (out / "summary.md").read_text()

    requests = spark.read.parquet(str(out / "requests"))
    delivered = requests.filter("outcome = 'delivered'")
    # The demo's traffic goes to twins 1 and 2 (and a few requests to twin 99, which fail).
    assert delivered.filter("dst = 2").count() >= TRAFFIC_REQUESTS // 2 - 10
    assert delivered.filter("dst = 1").count() >= TRAFFIC_REQUESTS // 2 - 10
    assert requests.filter("dst = 99 and outcome = 'failed'").count() >= 1
    complete = delivered.filter("end_to_end_us > 0 and send_us > 0 and remote_us > 0 and reply_path_us >= 0")
    assert complete.count() == delivered.count(), "every hop of a delivered request is measured (one host)"
