from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from spark import generate
from spark.anomaly_rules import AnomalyRules
from spark.job import MineOptions, run
from spark.mine import anomaly_rules, instant_us, main, parser
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


def test_anomaly_rules_are_set_on_the_command_line() -> None:
    follow = ["--follow", "--events", "a", "--out", "y"]
    windows = ["--recent-minutes", "1", "--baseline-minutes", "2"]
    samples = ["--min-recent", "20", "--min-baseline", "15"]
    bounds = ["--slower-factor", "4", "--failing-share", "0.2", "--failing-factor", "5"]
    args = parser().parse_args([*follow, *windows, *samples, *bounds])
    assert anomaly_rules(args) == AnomalyRules(
        recent_minutes=1,
        baseline_minutes=2,
        latency_factor=4.0,
        error_share=0.2,
        error_factor=5.0,
        min_recent=20,
        min_baseline=15,
    )
    defaults = parser().parse_args(["--follow", "--events", "a", "--out", "y"])
    assert anomaly_rules(defaults) == AnomalyRules()


def test_anomaly_windows_of_no_minute_are_refused_before_spark_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--follow", "--events", "a", "--out", "y", "--recent-minutes", "0"]) == 2
    assert "--recent-minutes, --baseline-minutes" in capsys.readouterr().err
