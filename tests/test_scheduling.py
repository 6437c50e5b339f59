"""The order in which `make test`'s workers take the scopes (tests/scheduling.py)."""

from __future__ import annotations

from pathlib import Path

from tests.scheduling import LONGEST_FIRST, RANK, is_there, rank_of

REPO = Path(__file__).resolve().parents[1]
R1 = "tests/faults/test_recovery.py::test_r1_peer_daemon_down_40s_while_2000_requests_wait"


def test_every_scope_named_is_there() -> None:
    assert [scope for scope in LONGEST_FIRST if not is_there(REPO, scope)] == []
    assert not is_there(REPO, "tests/faults/test_recovery.py::test_that_is_not_there")


def test_a_test_named_alone_keeps_its_place_with_each_of_its_parameters() -> None:
    assert rank_of(f"{R1}[default]") == rank_of(f"{R1}[hold-offline]") == LONGEST_FIRST.index(R1)


def test_a_test_of_a_named_module_takes_the_module_s_place_and_one_not_named_comes_last() -> None:
    networks = "tests/faults/test_networks.py"
    assert rank_of(f"{networks}::test_2_five_percent_loss_each_way_while_requests_flow") == RANK[networks]
    last = "tests/router/test_faults.py::test_7_edge_killed_while_a_servicebus_call_runs"
    assert rank_of(last) == len(RANK)
    assert rank_of("tests/spark/test_mine.py::test_job_writes_every_table_and_the_report") == 0
