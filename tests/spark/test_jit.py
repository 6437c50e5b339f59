from __future__ import annotations

import pytest

from spark.jit import (
    C1_ONLY,
    DRIVER_OPTIONS,
    EXECUTOR_OPTIONS,
    SMALL_INPUT_BYTES,
    compilers,
    is_local,
    java_options,
)

SMALL = SMALL_INPUT_BYTES - 1
LARGE = SMALL_INPUT_BYTES


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,2]"])
def test_local_masters_run_the_tasks_in_the_driver(master: str) -> None:
    assert is_local(master)


@pytest.mark.parametrize(
    "master", ["spark://127.0.0.1:7077", "yarn", "k8s://https://k:6443", "local-cluster[2,1,1024]"]
)
def test_other_masters_have_executors(master: str) -> None:
    assert not is_local(master)


def test_a_local_run_over_a_small_input_compiles_with_c1_alone() -> None:
    assert java_options("local[*]", SMALL) == {DRIVER_OPTIONS: C1_ONLY}
    assert java_options("local[*]", 0) == {DRIVER_OPTIONS: C1_ONLY}


def test_a_local_run_over_a_large_or_unknown_input_keeps_c2() -> None:
    assert java_options("local[*]", LARGE) == {}
    assert java_options("local[*]", None) == {}


def test_the_driver_of_a_cluster_only_plans_and_always_compiles_with_c1_alone() -> None:
    assert java_options("spark://h:7077", LARGE) == {DRIVER_OPTIONS: C1_ONLY}
    assert java_options("yarn", None) == {DRIVER_OPTIONS: C1_ONLY}


def test_executors_compile_with_c1_alone_over_a_small_input() -> None:
    assert java_options("spark://h:7077", SMALL) == {DRIVER_OPTIONS: C1_ONLY, EXECUTOR_OPTIONS: C1_ONLY}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], "C1 and C2"),
        (["-Xmx1g", C1_ONLY], "C1 alone"),
        (["-XX:TieredStopAtLevel=3"], "C1 alone"),
        ([C1_ONLY, "-XX:TieredStopAtLevel=4"], "C1 and C2"),
        (["-XX:TieredStopAtLevel=4", C1_ONLY], "C1 alone"),
    ],
)
def test_the_compilers_are_read_from_the_jvm_arguments_the_last_flag_winning(
    arguments: list[str], expected: str
) -> None:
    assert compilers(arguments) == expected
