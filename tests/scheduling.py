"""The order in which pytest-xdist's workers take the suite (``make test`` runs it with ``--dist loadscope``).

Each worker takes a whole module at a time. Left to itself, xdist hands out the modules with the most tests
first, so the few long end-to-end modules start last and the run waits for them at its end; here the longest
start first and the short ones fill the gaps. The Spark modules that share the session's SparkSession go to
one worker together, so that one JVM serves them all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

SHARED_SPARK_SESSION = "tests/spark"
# Spark modules that start JVMs of their own: they gain nothing from the shared session's worker.
OWN_JVMS = {
    "tests/spark/test_cluster.py",
    # Its JVMs are its own; alone it takes about as long as the shared session's other modules together.
    "tests/spark/test_follow_sites.py",
}

# Modules without module-scoped fixtures whose tests are long: each test is a scope of its own, so that
# the fault phase's workers share them out.
EACH_TEST_APART = {
    "tests/faults/test_faults.py",
    "tests/faults/test_recovery.py",
    "tests/router/test_faults.py",
}

# Scopes taking 20 s or more on 2 cores, longest first: the suite's modules, then the fault phase's, where
# the tests of EACH_TEST_APART are named one by one (all its parameters together), so that the longest of
# every module start first and the four workers end together.
LONGEST_FIRST = [
    SHARED_SPARK_SESSION,
    "tests/site/test_big_backlog.py",
    "tests/spark/test_cluster.py",
    "tests/spark/test_follow_sites.py",
    "tests/site/test_two_sites.py",
    "tests/router/test_e2e.py",
    "tests/door/test_fuzz_door.py",
    "tests/site/test_daemon_cli.py",
    "tests/sending/test_relays.py",
    "tests/link/test_links.py",
    "tests/site/test_processes.py",
    "tests/sending/test_uplinks.py",
    "tests/sending/test_many_down.py",
    "tests/support/test_many_twins.py",
    "tests/sending/test_way_back.py",
    "tests/site/test_load_balancer.py",
    "tests/faults/test_networks.py",
    "tests/faults/test_recovery.py::test_r1_peer_daemon_down_40s_while_2000_requests_wait",
    "tests/router/test_faults.py::test_3_servicebus_call_runs_once_when_answers_are_lost",
    "tests/faults/test_faults.py::test_3b_receiver_unreachable_for_20s_with_hold_offline",
    "tests/faults/test_faults.py::test_3a_receiver_unreachable_for_20s",
    "tests/faults/test_site_processes.py",
    "tests/router/test_faults.py::test_1_edge_offline_20s_then_cloud_offline",
    "tests/faults/test_faults.py::test_2_receiver_daemon_killed_repeatedly",
    "tests/faults/test_failover.py",
    "tests/faults/test_recovery.py::test_r2_both_daemons_killed_at_random_for_20s",
    "tests/faults/test_faults.py::test_1_sender_daemon_killed_repeatedly",
    "tests/faults/test_faults.py::test_6_service_crashes_mid_request",
    "tests/faults/test_recovery.py::test_r3_burst_of_5000_resends_due_at_once",
    "tests/faults/test_faults.py::test_5_sender_redis_restarted",
    "tests/faults/test_faults.py::test_4_answers_lost_after_the_request_arrived",
    "tests/netbed/test_bed.py",
]
RANK = {scope: rank for rank, scope in enumerate(LONGEST_FIRST)}


def scope_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in EACH_TEST_APART:
        return nodeid
    return _grouped(module)


def _grouped(module: str) -> str:
    if module.startswith(SHARED_SPARK_SESSION + "/") and module not in OWN_JVMS:
        return SHARED_SPARK_SESSION
    return module


def longest_first(items: list[pytest.Item], tests: Path) -> None:
    """Sorts ``items`` in place: the long scopes in their order, then the rest as collected."""
    missing = [scope for scope in LONGEST_FIRST if not is_there(tests.parent, scope)]
    if missing:
        raise pytest.UsageError(f"tests/scheduling.py names scopes that are not there: {missing}")
    items.sort(key=lambda item: rank_of(item.nodeid))


def rank_of(nodeid: str) -> int:
    module, _, test = nodeid.partition("::")
    named = RANK.get(f"{module}::{test.split('[', 1)[0]}")
    return named if named is not None else RANK.get(_grouped(module), len(RANK))


def is_there(root: Path, scope: str) -> bool:
    module, _, test = scope.partition("::")
    path = root / module
    return path.exists() and (not test or f"def {test}(" in path.read_text())


class LongestFirst(LoadScopeScheduling):
    """loadscope over the order of the collection (see ``longest_first``), with the shared Spark scope."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)
