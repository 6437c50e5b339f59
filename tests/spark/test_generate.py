from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from spark.generate import main
from spark.synthetic_events import MALFORMED_LINES
from wire import event_schema as ev


def _lines(folder: Path) -> dict[str, list[str]]:
    return {path.name: path.read_text().splitlines() for path in sorted(folder.glob("*.jsonl"))}


def test_generates_exactly_the_events_asked_for_one_file_per_site_in_time_order(tmp_path: Path) -> None:
    assert main(["--events", "3000", "--sites", "3", "--out", str(tmp_path), "--workers", "1"]) == 0
    files = _lines(tmp_path / "events")
    assert sorted(files) == ["events-1-00000.jsonl", "events-2-00000.jsonl", "events-3-00000.jsonl"]
    parsed = [json.loads(line) for lines in files.values() for line in lines]
    assert len(parsed) == 3000
    assert all(set(row) <= set(ev.EVENT_FIELDS) and row[ev.EVENT] in ev.EVENTS for row in parsed)
    for name, lines in files.items():
        stamps = [json.loads(line)[ev.TS] for line in lines]
        assert stamps == sorted(stamps)
        assert {json.loads(line)[ev.SITE] for line in lines} == {int(name.split("-")[1])}
    kinds = Counter(row[ev.EVENT] for row in parsed)
    assert kinds[ev.ACCEPTED] > 300 and kinds[ev.DELIVERED] > 300 and kinds[ev.SEND_FAILED] > 0
    backlog = [json.loads(line) for lines in _lines(tmp_path / "backlog").values() for line in lines]
    assert len(backlog) == 3000 and all(row[ev.KIND] in ev.BACKLOG_KINDS for row in backlog)
    assert any(row[ev.DEADLINE] < row[ev.TAKEN_AT] for row in backlog if ev.DEADLINE in row)


def test_noise_lines_come_on_top_and_chunks_run_in_parallel(tmp_path: Path) -> None:
    argv = ["--events", "5000", "--chunk-events", "1000", "--sites", "2", "--out", str(tmp_path)]
    noise = ["--malformed-rate", "0.01", "--duplicate-line-rate", "0.01", "--backlog-entries", "0"]
    main([*argv, *noise, "--workers", "2"])
    lines = [line for lines in _lines(tmp_path / "events").values() for line in lines]
    malformed = sum(line in MALFORMED_LINES for line in lines)
    duplicates = len(lines) - malformed - len(set(lines) - set(MALFORMED_LINES))
    assert len(_lines(tmp_path / "events")) == 2 * 5
    assert len(lines) - malformed - duplicates == 5000
    assert 20 < malformed < 90 and 20 < duplicates < 90
    assert not (tmp_path / "backlog").exists()
