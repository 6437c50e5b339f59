"""``python -m spark.mine`` / ``spark-submit spark/mine.py`` / ``msgbus-mine``: mine msgbus event logs and
backlog snapshots into Parquet tables, summary.md and report.html.

    python -m spark.mine --events 'logs/*.jsonl' --backlog 'backlog/*.jsonl' --out mined/
    spark-submit --master yarn spark/mine.py --events hdfs:///msgbus/events --out hdfs:///msgbus/mined
    python -m spark.mine --follow --events /var/log/msgbus/events --out live/   (spark.follow)

PySpark is imported only when the job runs, so the ``msgbus`` CLI can offer this command without it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from spark.anomaly_rules import AnomalyRules

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark.progress import Progress

if __name__ == "__main__" and not __package__:
    # spark-submit runs this file as a script: import the package from its parent directory, and keep the
    # package's own directory off sys.path so its module names cannot shadow others.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# How long a stopping --follow waits for its micro-batch to end.
STOP_WAIT_S = 60.0


def instant_us(text: str) -> int:
    """An ISO 8601 date or datetime as microseconds since the epoch; without a zone it is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 datetime: {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) // timedelta(microseconds=1)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="msgbus-mine", description="Mine msgbus event logs and backlog snapshots with Spark."
    )
    p.add_argument(
        "--events", nargs="+", required=True, metavar="PATH", help="event log files, globs or URIs"
    )
    p.add_argument(
        "--backlog", nargs="+", default=[], metavar="PATH", help="backlog snapshot files (optional)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory or URI (replaced tables)")
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument(
        "--since", type=instant_us, default=None, help="keep events at or after this ISO 8601 time"
    )
    p.add_argument("--until", type=instant_us, default=None, help="keep events before this ISO 8601 time")
    p.add_argument("--driver-memory", default="8g", help="driver JVM heap when not under spark-submit")
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="default: one per core, more for inputs over 64 MB per core",
    )
    follow = p.add_argument_group("following a running site (--follow)")
    follow.add_argument(
        "--follow",
        action="store_true",
        help="follow the event log directory --events as the daemons write it (Structured Streaming)",
    )
    follow.add_argument(
        "--checkpoint", metavar="DIR", help="the stream's checkpoint (default OUT/_checkpoint)"
    )
    follow.add_argument("--trigger", type=float, default=5.0, metavar="SECONDS", help="a micro-batch every")
    follow.add_argument(
        "--watermark",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how late an event may come and still count (above the logs' rotation period)",
    )
    follow.add_argument(
        "--lookback",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how far back a request's first events are looked for (its longest lifetime)",
    )
    rules = p.add_argument_group(
        "anomalies (--follow): the recent minutes judged against the baseline minutes before them"
    )
    defaults = AnomalyRules()
    for flag, name, kind, metavar, explained in RULE_FLAGS:
        default = getattr(defaults, name)
        rules.add_argument(flag, dest=name, type=kind, default=default, metavar=metavar, help=explained)
    return p


# The flags of AnomalyRules: flag, field, type, metavar, help.
RULE_FLAGS: tuple[tuple[str, str, type, str, str | None], ...] = (
    ("--recent-minutes", "recent_minutes", int, "N", None),
    ("--baseline-minutes", "baseline_minutes", int, "N", None),
    ("--slower-factor", "latency_factor", float, "X", "slower: recent p99 at least X times the usual p99"),
    ("--failing-share", "error_share", float, "SHARE", "failing: recent share failed or expired at least"),
    ("--failing-factor", "error_factor", float, "X", "... and at least X times the baseline's share"),
    ("--min-recent", "min_recent", int, "N", "requests needed in the recent minutes for a judgement"),
    ("--min-baseline", "min_baseline", int, "N", "requests needed in the baseline for a judgement"),
)


def anomaly_rules(args: argparse.Namespace) -> AnomalyRules:
    return AnomalyRules(**{name: getattr(args, name) for _, name, *_ in RULE_FLAGS})


def main(argv: list[str] | None = None) -> int:
    """Run the job; 0 when the tables and the report were written."""
    args = parser().parse_args(argv)
    if args.since is not None and args.until is not None and args.since >= args.until:
        print("msgbus-mine: --since must be before --until", file=sys.stderr)
        return 2

    if args.follow:
        return follow(args)

    from spark.ingest import resolve_paths
    from spark.job import MineOptions, run
    from spark.partitioning import local_input_bytes
    from spark.progress import Progress

    progress = Progress()
    started = time.monotonic()
    size = local_input_bytes(resolve_paths([*args.events, *args.backlog])[0])
    spark = start_spark(progress, args.master, args.driver_memory, size)
    try:
        options = MineOptions(
            events=args.events,
            backlog=args.backlog,
            out=args.out,
            since_us=args.since,
            until_us=args.until,
            shuffle_partitions=args.shuffle_partitions,
        )
        data = run(spark, options, progress)
    finally:
        spark.stop()
    progress.note(
        f"done in {time.monotonic() - started:.1f}s: {data.events.kept:,} events, "
        f"{data.outcomes.get('requests', 0):,} requests; report in {args.out}"
    )
    return 0


def start_spark(
    progress: Progress, master: str | None, driver_memory: str, input_bytes: int | None
) -> SparkSession:
    """The job's session, its start timed and described on the terminal."""
    from spark.jit import driver_compilers
    from spark.session import build_session

    with progress.stage("start Spark") as stage:
        spark = build_session(master, driver_memory, input_bytes)
        context = spark.sparkContext
        cores = f"{context.defaultParallelism} cores"
        stage.detail = f"master {context.master}, {cores}, driver with {driver_compilers(spark)}"
    return spark


def follow(args: argparse.Namespace) -> int:
    """Follow one event log directory until Ctrl-C or SIGTERM; 0 when stopped so."""
    if len(args.events) != 1 or args.backlog or args.since is not None or args.until is not None:
        print(
            "msgbus-mine: --follow takes one --events directory, and no --backlog, --since or --until",
            file=sys.stderr,
        )
        return 2
    rules = anomaly_rules(args)
    if min(rules.recent_minutes, rules.baseline_minutes, rules.min_recent, rules.min_baseline) < 1:
        print(
            "msgbus-mine: --recent-minutes, --baseline-minutes, --min-recent and --min-baseline must be at "
            "least 1",
            file=sys.stderr,
        )
        return 2
    from spark.follow import FollowOptions, start
    from spark.progress import Progress

    progress = Progress()
    # A job that runs for days: its JVM keeps both compilers (input size unknown).
    spark = start_spark(progress, args.master, args.driver_memory, None)
    # Micro-batches are small: one partition per core (Spark's default of 200 is for large shuffles).
    partitions = args.shuffle_partitions or spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    options = FollowOptions(
        events=args.events[0],
        out=args.out,
        checkpoint=args.checkpoint or f"{args.out.rstrip('/')}/_checkpoint",
        trigger_s=args.trigger,
        watermark_s=args.watermark,
        lookback_s=args.lookback,
        rules=rules,
    )
    query = start(spark, options)
    progress.note(
        f"following {options.events} (*.jsonl), a micro-batch every {options.trigger_s:g}s; tables and "
        f"now.html in {options.out}, checkpoint {options.checkpoint}; Ctrl-C to stop"
    )
    stopping = threading.Event()
    for received in (signal.SIGINT, signal.SIGTERM):
        signal.signal(received, lambda *_: stopping.set())
    try:
        while query.isActive and not stopping.wait(1.0):
            pass
        failure = query.exception()
        if failure is not None:
            progress.note(f"the stream stopped: {failure}")
            return 1
        progress.note("stopping: the next start on the same checkpoint goes on from here")
        # Between two micro-batches: one cut short would only be done again, but its thread, interrupted
        # in the middle of Spark's work, dies with an error of its own.
        deadline = time.monotonic() + STOP_WAIT_S
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
