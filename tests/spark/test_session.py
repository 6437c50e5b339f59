"""The session the job builds starts its driver JVM with the compilers spark.jit chose (a JVM of its own,
in a process of its own: the test session's JVM is already running)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark.jit import C1_ONLY

REPO = Path(__file__).resolve().parents[2]
DRIVER_ARGUMENTS = """
import json, sys
from spark.session import build_session
spark = build_session("local[1]", "512m", int(sys.argv[1]))
bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(json.dumps(list(bean.getInputArguments())))
spark.stop()
"""


def driver_arguments(input_bytes: int) -> list[str]:
    command = [sys.executable, "-c", DRIVER_ARGUMENTS, str(input_bytes)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_a_local_driver_over_a_small_input_compiles_with_c1_alone() -> None:
    assert C1_ONLY in driver_arguments(1_000_000)


@pytest.mark.slow
def test_a_local_driver_over_a_large_input_keeps_c2() -> None:
    assert not any(argument.startswith("-XX:TieredStopAtLevel") for argument in driver_arguments(10**10))
