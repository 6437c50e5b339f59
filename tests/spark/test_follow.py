"""``msgbus mine --follow`` over event log files that appear while it runs (written here, with times chosen
so that minutes close on cue): the per-minute tables equal the batch job's over the same files, late events
within the watermark count, a batch done again writes nothing twice, and a destination that turns slow is
an anomaly while one that stays fast is not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from spark import minutes
from spark.anomalies import FAILING, SLOWER
from spark.anomaly_rules import AnomalyRules
from spark.follow import ANOMALIES, Follower, FollowOptions, events_older_than, read_table, start
from spark.schema import event_schema, with_corrupt_record
from tests.spark.follow_logs import (
    FAST,
    MINUTE,
    SLOW,
    START,
    WATERMARK_S,
    batch_tables,
    closed_until,
    traffic,
    write_log,
)
from tests.spark.frames import round_trip
from wire import event_schema as ev

RULES = AnomalyRules(recent_minutes=2, baseline_minutes=10, min_recent=5, min_baseline=20)


class Followed:
    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.logs = root / "logs"
        self.logs.mkdir()
        self.out = str(root / "out")
        self.options = FollowOptions(
            events=str(self.logs),
            out=self.out,
            checkpoint=str(root / "checkpoint"),
            trigger_s=0.5,
            watermark_s=WATERMARK_S,
            rules=RULES,
        )
        self.query = start(spark, self.options)
        self.query_input_schema = with_corrupt_record(event_schema())

    def catch_up(self) -> None:
        self.query.processAllAvailable()

    @property
    def last_batch(self) -> int:
        return int(self.now()["progress"]["batch"])

    def restart(self) -> None:
        self.query.stop()
        self.query = start(self.spark, self.options)

    def files_of(self, batch: int) -> list[str]:
        """The files the stream read in micro-batch ``batch``, from its checkpoint (the files written at
        once may come in one micro-batch or in two)."""
        entries = Path(self.options.checkpoint, "sources", "0", str(batch)).read_text().splitlines()[1:]
        return [str(json.loads(entry)["path"]) for entry in entries]

    def now(self) -> dict[str, Any]:
        return dict(json.loads(Path(self.out, "now.json").read_text()))

    def table(self, name: str) -> DataFrame:
        return read_table(self.spark, self.out, name)


@pytest.fixture
def followed(spark: SparkSession, tmp_path: Path) -> Iterator[Followed]:
    following = Followed(spark, tmp_path)
    try:
        yield following
    finally:
        following.query.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_followed_logs_give_the_batch_tables_minute_by_minute_and_the_slow_destination_as_anomaly(
    spark: SparkSession, followed: Followed
) -> None:
    # The sites' files are not rotated together: the destinations' events of minute 19 come after the
    # source's of minute 20, within the watermark, and count.
    everything = traffic(0, 8)
    write_log(followed.logs, "a", [e for e in everything if e[ev.SITE] == 1 or e[ev.TS] < START + 7 * MINUTE])
    followed.catch_up()
    # The newest event read is at minute 7: with a watermark of a minute, the minutes before 6 are closed.
    assert closed_until(followed.now()) == START + 6 * MINUTE
    write_log(
        followed.logs,
        "b",
        [e for e in everything if e[ev.SITE] != 1 and e[ev.TS] >= START + 7 * MINUTE] + traffic(8, 15),
        extra_lines=("not json", json.dumps(round_trip(START + 10 * MINUTE, uid="2.dup")[0])),
    )
    write_log(followed.logs, "b2", [round_trip(START + 10 * MINUTE, uid="2.dup")[0]])
    followed.catch_up()
    # A crash in the middle of the last micro-batch: started again, Spark does it again whole, with the same
    # files (its checkpoint lists them), in a new process (a Follower that has to read its state back); then
    # the stream goes on from its checkpoint.
    followed.query.stop()
    last = followed.last_batch
    again = followed.spark.read.schema(followed.query_input_schema).json(followed.files_of(last))
    Follower(followed.spark, followed.options).handle(again, last)
    followed.restart()
    write_log(followed.logs, "c", traffic(15, 20))
    followed.catch_up()

    now = followed.now()
    progress = now["progress"]
    assert progress["late"] == 0
    assert progress["malformed"] == {"not valid JSON for the schema": 1}
    assert progress["duplicates"] == 1
    assert progress["batches"] == followed.last_batch + 1, "the batch done again is counted once"
    assert closed_until(now) == START + 18 * MINUTE

    # Minute by minute, what the batch job computes over the same files (the minutes closed so far).
    expected = batch_tables(followed.spark, followed.logs, closed_until(now))
    for name in minutes.TABLES:
        assertDataFrameEqual(followed.table(name), expected[name])
    latency = followed.table(minutes.LATENCY)
    assert (
        latency.groupBy(minutes.MINUTE, ev.SRC, ev.DST, ev.CMD, "hop").count().where("count > 1").count() == 0
    )
    assert latency.where(f"dst = {SLOW} and hop = 'end_to_end'").count() == 18

    # SLOW turned slow at minute 15: an anomaly of the minutes after, FAST never; the view shows it first.
    found = followed.table(ANOMALIES)
    slower = found.where(F.col("kind") == SLOWER)
    assert {(row[ev.DST], row[ev.CMD]) for row in slower.collect()} == {(SLOW, "calc.add")}
    assert found.where(F.col(ev.DST) == FAST).count() == 0
    assert now["anomalies"][0]["kind"] == SLOWER and now["anomalies"][0]["dst"] == SLOW
    assert now["slowest_destinations"][0]["dst"] == SLOW
    assert {row["dst"] for row in now["errors"]} == {SLOW}
    assert 'http-equiv="refresh"' in Path(followed.out, "now.html").read_text()
    assert FAILING not in {row["kind"] for row in found.collect()}
    # A batch done again reads the state of the one before it: older states are let go.
    states = sorted(path.name for path in Path(followed.out, "follow_state").glob("batch=*"))
    assert states == [f"batch={followed.last_batch - 1}", f"batch={followed.last_batch}"]


def test_a_batch_whose_events_are_all_older_than_the_batches_look_back_is_let_go() -> None:
    # (batch, the newest event time read once it was done): a batch holds nothing newer.
    stored = [[0, 100], [1, 250], [2, 250], [3, 400]]
    assert events_older_than(stored, 250) == [0]
    assert events_older_than(stored, 251) == [0, 1, 2]
    assert events_older_than(stored, 50) == []
