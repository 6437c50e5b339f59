from __future__ import annotations

import base64
import re
from datetime import UTC, datetime

from spark.report import InputCounts, ReportData, format_value, markdown_table, report_html, summary_markdown

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _data() -> ReportData:
    hour = datetime(2026, 11, 21, 21, tzinfo=UTC)
    return ReportData(
        out="mined",
        events=InputCounts(lines=120, kept=110, malformed={"not valid JSON for the schema": 7}, duplicates=3),
        backlog=InputCounts(lines=5, kept=5),
        first_event_at=hour,
        last_event_at=hour,
        sites=[1, 2],
        outcomes={"requests": 14, "delivered": 12, "failed": 1, "expired": 1, "unanswered": 0},
        end_to_end={"samples": 12, "p50_ms": 5.4, "p90_ms": 6.0, "p99_ms": 7.25, "max_ms": 7.5},
        slowest=[
            {"rank": 1, "dst": 2, "samples": 12, "p50_ms": 5.4, "p90_ms": 6.0, "p99_ms": 7.25, "max_ms": 7.5}
        ],
        by_command=[
            {
                "src": 1,
                "dst": 2,
                "cmd": "calc.add",
                "samples": 12,
                "p50_ms": 5.4,
                "p90_ms": 6.0,
                "p99_ms": 7.25,
                "max_ms": 7.5,
                "sender_queue_p99_ms": 0.5,
                "send_p99_ms": 1.5,
                "remote_p99_ms": 4.25,
                "reply_path_p99_ms": None,
            }
        ],
        command_count=3,
        latency_by_hour=[{"hour": hour, "dst": 2, "samples": 12, "p50_ms": 5.4, "p99_ms": 7.25}],
        error_totals=[{"cause": "connection refused", "events": 3}],
        throughput=[{"period": hour, "accepted": 14, "delivered": 12, "failed": 1, "expired": 1}],
        backlog_ages=[{"bucket": 0, "age_range": "<1s", "kind": "request", "entries": 5}],
        leak_count=2,
        tables={"requests": 14},
    )


def test_values_read_well() -> None:
    assert [format_value(v) for v in (None, True, 1234567, 0.5, "x")] == [
        "–",
        "yes",
        "1,234,567",
        "0.500",
        "x",
    ]
    assert format_value(datetime(2026, 11, 21, 21, 6, 40, 123)) == "2026-11-21 21:06:40"


def test_markdown_table_escapes_pipes_and_says_when_empty() -> None:
    assert markdown_table([{"a": 1, "b": "x|y"}], ["a", "b"]) == "| a | b |\n|---|---|\n| 1 | x\\|y |"
    assert markdown_table([], ["a"]) == "_(none)_"


def test_summary_has_the_counts() -> None:
    summary = summary_markdown(_data())
    assert "- events: 120 lines read, 110 kept, 7 malformed, 3 exact duplicates dropped" in summary
    assert "  - malformed, not valid JSON for the schema: 7" in summary
    assert "delivered 12, failed 1, expired 1, no outcome 0" in summary
    assert "p99 7.250 ms" in summary
    assert "- backlog entries older than their deadline: 2" in summary
    assert "- `requests`: 14 rows" in summary


def test_latency_is_broken_down_by_command_with_each_hop() -> None:
    summary = summary_markdown(_data())
    assert "## Latency by command, slowest p99 first (1 of 3;" in summary
    header = "| src | dst | cmd | samples | p50_ms | p90_ms | p99_ms | max_ms | sender_queue_p99_ms |"
    assert header in summary
    assert "| 1 | 2 | calc.add | 12 | 5.400 | 6.000 | 7.250 | 7.500 | 0.500 | 1.500 | 4.250 | – |" in summary
    assert "<td>calc.add</td>" in report_html(_data())


def test_html_is_self_contained_with_four_png_charts() -> None:
    page = report_html(_data())
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(image).startswith(PNG_SIGNATURE) for image in images)
    assert "http://" not in page and "https://" not in page


def test_empty_input_makes_an_empty_report() -> None:
    data = ReportData(out="mined", events=InputCounts(), backlog=None)
    assert "- backlog snapshots: none given" in summary_markdown(data)
    assert "no events" in summary_markdown(data)
    assert report_html(data).count("data:image/png;base64,") == 4
