from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from spark import generate
from spark.jit import C1_ONLY
from spark.job import MineOptions, run
from spark.mine import instant_us, main
from spark.progress import Progress
from spark.synthetic_events import MALFORMED_LINES
from tests.spark.frames import T0
from wire import event_schema as ev

TABLES = {
    "latency_end_to_end",
    "latency_end_to_end_hourly",
    "latency_hops",
    "slowest_destinations",
    "errors",
    "delivery",
    "throughput_per_minute",
    "backlog_age_histogram",
    "backlog_leaks",
    "requests",
    "unanswered",
    "latency_per_minute",
    "errors_per_minute",
    "unanswered_per_minute",
}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("logs")
    argv = ["--events", "4000", "--sites", "3", "--hosts", "2", "--hours", "2", "--out", str(folder)]
    noise = ["--malformed-rate", "0.005", "--duplicate-line-rate", "0.005", "--backlog-entries", "200"]
    assert generate.main([*argv, *noise, "--workers", "1"]) == 0
    return folder


def _events_in(folder: Path) -> list[dict[str, object]]:
    lines = [line for path in folder.glob("events/*.jsonl") for line in path.read_text().splitlines()]
    return [json.loads(line) for line in set(lines) if line not in MALFORMED_LINES]


def test_job_writes_every_table_and_the_report(spark: SparkSession, logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "mined"
    terminal = io.StringIO()
    options = MineOptions(
        events=[str(logs / "events" / "*.jsonl")], backlog=[str(logs / "backlog")], out=str(out)
    )
    data = run(spark, options, Progress(terminal))

    assert {path.name for path in out.iterdir() if path.is_dir()} == TABLES
    assert (out / "summary.md").exists() and (out / "report.html").exists()
    events = _events_in(logs)
    accepted = sum(row[ev.EVENT] == ev.ACCEPTED for row in events)
    delivered = sum(row[ev.EVENT] == ev.DELIVERED for row in events)
    assert data.events.kept == 4000
    assert data.outcomes["requests"] == accepted and data.outcomes["delivered"] == delivered
    assert data.tables["requests"] == len({(row[ev.SRC], row[ev.UID]) for row in events if ev.UID in row})
    assert data.tables["backlog_leaks"] == data.leak_count > 0
    summary = (out / "summary.md").read_text()
    malformed = data.events.malformed_total
    assert malformed > 0 and f"{malformed:,} malformed" in summary
    assert data.command_count == data.tables["latency_end_to_end"] > 0
    p99s = [row["p99_ms"] for row in data.by_command]
    assert p99s == sorted(p99s, reverse=True)
    slowest = data.by_command[0]
    assert slowest["remote_p99_ms"] is not None
    assert f"| {slowest['src']} | {slowest['dst']} | {slowest['cmd']} |" in summary
    lines = terminal.getvalue()
    assert "read events: " in lines and f"{malformed:,} malformed" in lines and "table requests: " in lines
    hops = spark.read.parquet(str(out / "latency_hops"))
    # Three sites on two hosts: some reply paths cross hosts and are counted, not measured.
    assert hops.where("hop = 'reply_path' and cross_host > 0").count() > 0


def test_empty_input_and_no_backlog_give_an_empty_report(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("")
    out = tmp_path / "mined"
    options = MineOptions(
        events=[str(tmp_path / "events.jsonl"), str(tmp_path / "none-*")], backlog=[], out=str(out)
    )
    data = run(spark, options, Progress(io.StringIO()))
    assert set(data.tables.values()) == {0}
    summary = (out / "summary.md").read_text()
    assert "- backlog snapshots: none given" in summary and "no file matches" in summary
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 4


def test_times_are_iso_8601_and_utc_without_a_zone() -> None:
    assert instant_us("2026-11-21T22:26:40Z") == T0
    assert instant_us("2026-11-21T22:26:40") == T0
    assert instant_us("2026-11-21T23:26:40.000001+01:00") == T0 + 1
    with pytest.raises(argparse.ArgumentTypeError):
        instant_us("yesterday")


def test_an_empty_window_is_refused_before_spark_starts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--events", "x", "--out", "y", "--since", "2026-11-22", "--until", "2026-11-21"]
    assert main(argv) == 2
    assert "--since must be before --until" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spark_submit_runs_the_job(logs: Path, tmp_path: Path) -> None:
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    args = [
        "--events",
        str(logs / "events"),
        "--out",
        str(tmp_path),
        "--master",
        "local[2]",
        "--driver-memory",
        "1g",
    ]
    # spark-submit passes the driver's stderr on through its stdout.
    env = os.environ | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    # A small input: C1 alone, as docs/mining.md tells spark-submit's users (the job leaves spark-submit's
    # driver options alone).
    c1_driver = ["--conf", f"spark.driver.defaultJavaOptions={C1_ONLY}"]
    done = subprocess.run(
        [spark_submit, *c1_driver, "spark/mine.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    assert "read events: " in terminal and "done in " in terminal
    assert "driver with C1 alone" in terminal, "spark-submit's flags decide, as the running JVM says"
    assert "- backlog snapshots: none given" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--follow", "--events", "a", "b", "--out", "y"],
        ["--follow", "--events", "a", "--backlog", "b", "--out", "y"],
        ["--follow", "--events", "a", "--since", "2026-11-21", "--out", "y"],
    ],
)
def test_follow_takes_one_directory_and_no_window_before_spark_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "--follow takes one --events directory" in capsys.readouterr().err


def test_msgbus_mine_passes_its_arguments_to_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    from client.cli import app

    result = CliRunner().invoke(app, ["mine", "--follow", "--events", "a", "b", "--out", "y"])
    assert result.exit_code == 2
    assert "--follow takes one --events directory" in capsys.readouterr().err + result.output
