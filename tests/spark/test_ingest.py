from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.ingest import (
    BACKLOG,
    DISPOSITION,
    EVENTS,
    NOT_JSON,
    OUTSIDE_WINDOW,
    classify_lines,
    deduplicated,
    kept_rows,
    load,
    mark_outside_window,
    resolve_paths,
)
from spark.schema import event_schema, with_corrupt_record
from tests.spark.frames import T0, event, round_trip
from wire import event_schema as ev

MISSING = "missing ts, site, event"
UNKNOWN = "unknown event"


def _raw(spark: SparkSession, rows: list[tuple[dict[str, object], str | None]]) -> DataFrame:
    schema = with_corrupt_record(event_schema())
    data = [(*(fields.get(name) for name in event_schema().names), corrupt) for fields, corrupt in rows]
    return spark.createDataFrame(data, schema)


def test_lines_are_classified_by_why_they_are_malformed(spark: SparkSession) -> None:
    raw = _raw(
        spark,
        [
            (event(T0, 1, ev.ACCEPTED, uid="good"), None),
            ({ev.UID: "broken"}, '{"ts": 17'),
            (event(T0, 1, ev.SENT, uid="no-site") | {ev.SITE: None}, None),
            (event(T0, 1, "teleported", uid="unknown"), None),
        ],
    )
    actual = classify_lines(raw, EVENTS).select(ev.UID, DISPOSITION)
    expected = [Row(uid="good", _disposition=None), Row(uid="broken", _disposition=NOT_JSON)]
    expected += [Row(uid="no-site", _disposition=MISSING), Row(uid="unknown", _disposition=UNKNOWN)]
    assertDataFrameEqual(actual, expected)


def test_window_sets_aside_valid_lines_outside_it_only(spark: SparkSession) -> None:
    raw = _raw(spark, [(row, None) for row in round_trip()] + [({ev.UID: "broken"}, "x")])
    windowed = mark_outside_window(classify_lines(raw, EVENTS), ev.TS, T0 + 1000, T0 + 5000)
    counts = {row[DISPOSITION]: row["count"] for row in windowed.groupBy(DISPOSITION).count().collect()}
    # kept: sent 1200, received 1500, handed 1600, reply_taken 4000; 5000 is the exclusive end
    assert counts == {None: 4, OUTSIDE_WINDOW: 4, NOT_JSON: 1}


def test_kept_rows_drop_exact_duplicates_and_bookkeeping(spark: SparkSession) -> None:
    first = round_trip()[0]
    retry = first | {ev.TS: T0 + 1}
    raw = _raw(spark, [(first, None), (first, None), (retry, None), ({}, "junk")])
    kept = kept_rows(deduplicated(classify_lines(raw, EVENTS)))
    assert kept.columns == list(ev.EVENT_FIELDS)
    assert sorted(row[ev.TS] for row in kept.collect()) == [T0, T0 + 1]


def test_local_globs_expand_uris_pass_and_unmatched_are_reported(tmp_path: Path) -> None:
    (tmp_path / "events-1-a.jsonl").write_text("")
    (tmp_path / "events-2-a.jsonl").write_text("")
    found, unmatched = resolve_paths(
        [str(tmp_path / "events-*.jsonl"), "hdfs:///logs/*", str(tmp_path / "x*")]
    )
    assert found == [str(tmp_path / "events-1-a.jsonl"), str(tmp_path / "events-2-a.jsonl"), "hdfs:///logs/*"]
    assert unmatched == [str(tmp_path / "x*")]


def test_load_counts_malformed_and_duplicate_lines_of_two_sites_mixed_out_of_order(
    spark: SparkSession, tmp_path: Path
) -> None:
    lines = [json.dumps(row) for row in reversed(round_trip())]
    lines.insert(3, lines[0])  # an exact duplicate
    lines += [
        "",
        "not json",
        '{"ts":"yesterday","site":1,"event":"sent"}',
        '{"site":1,"event":"sent"}',
        '{"ts":1,"site":1,"event":"teleported"}',
    ]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    loaded = load(spark, [str(tmp_path / "*.jsonl")], EVENTS, None, None)
    try:
        assert (loaded.lines, loaded.kept, loaded.duplicates) == (13, 8, 1)
        assert loaded.malformed == {NOT_JSON: 2, MISSING: 1, UNKNOWN: 1}
        assert sorted(row[ev.TS] - T0 for row in loaded.rows.collect()) == [
            0,
            1200,
            1500,
            1600,
            4000,
            5000,
            5300,
            5400,
        ]
    finally:
        loaded.release()


def test_load_of_nothing_is_empty_not_an_error(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    for patterns in ([str(tmp_path / "empty.jsonl")], [str(tmp_path / "none-*.jsonl")], []):
        loaded = load(spark, patterns, BACKLOG, None, None)
        assert (loaded.lines, loaded.kept, loaded.set_aside, loaded.rows.count()) == (0, 0, {}, 0)
        assert loaded.rows.columns == list(ev.BACKLOG_FIELDS)
        loaded.release()


def test_a_glob_of_jsonl_files_leaves_out_the_file_a_daemon_is_writing_a_directory_does_not(
    spark: SparkSession, tmp_path: Path
) -> None:
    complete, writing = round_trip()[:2]
    (tmp_path / "events-1-a.jsonl").write_text(json.dumps(complete) + "\n")
    (tmp_path / "events-1-b.jsonl.writing").write_text(json.dumps(writing) + "\n" + '{"ts": 1, "si')
    loaded = load(spark, [str(tmp_path / "*.jsonl")], EVENTS, None, None)
    try:
        assert (loaded.lines, loaded.kept, loaded.set_aside) == (1, 1, {})
    finally:
        loaded.release()
    # A directory, or the file itself, is read as it is: its last line, still being written, is malformed.
    for patterns in ([str(tmp_path)], [str(tmp_path / "events-1-a.jsonl"), str(tmp_path / "*.writing")]):
        loaded = load(spark, patterns, EVENTS, None, None)
        try:
            assert (loaded.lines, loaded.kept, loaded.malformed) == (3, 2, {NOT_JSON: 1}), patterns
        finally:
            loaded.release()
