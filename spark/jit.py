"""Which of HotSpot's compilers the job's JVMs use.

A JVM compiles hot code twice: quickly with C1, then again, optimised, with C2. C2 is what makes a long run
fast, but it is dear: in a local run over 200,000 events (29 MB) its thread was busy for 20 s of the 25 s,
one of the machine's two cores, for code that had little left to run by the time it was compiled. So:

- a JVM that only plans and schedules (the driver of a cluster: the executors go through the rows) compiles
  with C1 alone;
- a JVM that goes through the rows (the driver of a local run, an executor) does too when the whole input is
  small, under SMALL_INPUT_BYTES, and keeps C2 otherwise.

Local runs, 2 cores: 200,000 events (29 MB) 24.5 s with C2 against 19.8 s with C1 alone; 1,000,000 events
(144 MB) 34.2 s against 34.1 s; 10,000,000 events (1.4 GB) 105 s against 187 s.

The options go in ``spark.{driver,executor}.defaultJavaOptions``, which Spark puts before the
``extraJavaOptions``: a ``-XX:TieredStopAtLevel=4`` given there by a user turns C2 back on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

C1_ONLY: Final = "-XX:TieredStopAtLevel=1"
# Inputs below this size are mined sooner without C2 (see the figures above).
SMALL_INPUT_BYTES: Final = 64 * 1024 * 1024
DRIVER_OPTIONS: Final = "spark.driver.defaultJavaOptions"
EXECUTOR_OPTIONS: Final = "spark.executor.defaultJavaOptions"


def is_local(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]``: the driver runs the tasks."""
    return master == "local" or master.startswith("local[")


def java_options(master: str, input_bytes: int | None) -> dict[str, str]:
    """The Spark settings that choose the compilers of a job on ``master`` over ``input_bytes`` of input
    (None: not known, taken as large)."""
    small = input_bytes is not None and input_bytes < SMALL_INPUT_BYTES
    if is_local(master):
        return {DRIVER_OPTIONS: C1_ONLY} if small else {}
    options = {DRIVER_OPTIONS: C1_ONLY}
    if small:
        options[EXECUTOR_OPTIONS] = C1_ONLY
    return options


def compilers(jvm_arguments: list[str]) -> str:
    """How a JVM started with ``jvm_arguments`` compiles: ``C1 alone`` or ``C1 and C2``."""
    stops = [arg for arg in jvm_arguments if arg.startswith("-XX:TieredStopAtLevel=")]
    # Levels 1-3 are C1's; the last flag given wins.
    return "C1 alone" if stops and stops[-1] != "-XX:TieredStopAtLevel=4" else "C1 and C2"


def driver_compilers(spark: SparkSession) -> str:
    """How the driver's JVM compiles, read from the running JVM (under spark-submit, its flags decided)."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    return compilers([str(arg) for arg in runtime.getInputArguments()])
