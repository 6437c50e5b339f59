"""An archive of the classes a Spark job's JVM loads (HotSpot's class data sharing), for the tests' JVMs.

    python -m testing.spark_classes ARCHIVE

A JVM that starts with ``-XX:SharedArchiveFile=ARCHIVE`` maps the classes in instead of loading and checking
them one by one: a local session that runs one small job costs 6.7 s of CPU against 11 s without, the
shared session's follow tests 57 s against 74. ``make test`` builds the archive once per virtual
environment from a small job over a few generated events and hands it to every JVM of the tests. A JVM
whose class path differs from this run's (a cluster's master and worker), or a Java other than the one
that built it, loads its classes as usual.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark import generate
from spark.jit import C1_ONLY, DRIVER_OPTIONS
from spark.schema import event_schema
from wire import event_schema as ev


def build(archive: Path) -> None:
    archive.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="msgbus-spark-classes-") as work:
        logs = Path(work) / "logs"
        generate.main(["--events", "400", "--sites", "2", "--out", str(logs), "--workers", "1"])
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            # Spark's scratch files (its temporary and local directories, the native libraries it unpacks) in
            # the work directory, removed with it: this JVM is ended without the hooks that remove them.
            .config(
                DRIVER_OPTIONS,
                f"{C1_ONLY} -XX:ArchiveClassesAtExit={archive} -Xlog:cds=off -Djava.io.tmpdir={work}",
            )
            .getOrCreate()
        )
        try:
            # What most jobs of the tests do, in one small job: JSON read, Parquet written and read, a
            # shuffle, percentiles and a window.
            events = spark.read.schema(event_schema()).json(str(logs / "events"))
            events.write.parquet(f"{work}/events")
            stored = spark.read.parquet(f"{work}/events")
            stats = stored.groupBy(ev.DST).agg(F.percentile_approx(ev.TS, [0.5, 0.99], 100).alias("p"))
            ranked = stats.withColumn("rank", F.row_number().over(Window.orderBy(F.col("p")[1].desc())))
            ranked.collect()
        finally:
            gateway = spark.sparkContext._gateway
            spark.stop()
        # The JVM writes the archive as it exits, which it does once its standard input is closed.
        assert gateway is not None, "a local session has a JVM"
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=120)
    if not archive.exists():
        raise SystemExit(f"the JVM wrote no class archive at {archive}")


if __name__ == "__main__":
    build(Path(sys.argv[1]).resolve())
