"""The WAN benchmark's harness in the network test bed, msgbus only, small: every request answered, no round
trip faster than the network, the tables made from the rows, and the bed gone afterwards."""

from __future__ import annotations

import os

import pytest

from bench.wan import Settings, crowd_table, in_rtts, latency_table, run
from testing.netbed import require_netbed
from testing.netbed.namespaces import list_namespaces

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(120)]

DELAY_MS = 10.0


@pytest.fixture
def needs_netbed() -> None:
    reason = require_netbed()
    if reason is not None:
        pytest.skip(reason)


def test_msgbus_across_a_delay_answers_everything_no_faster_than_the_network(needs_netbed: None) -> None:
    settings = Settings(
        delays_ms=(0.0, DELAY_MS),
        warmup_s=0.5,
        duration_s=1.0,
        min_requests=5,
        paced=3,
        every_s=0.3,
        rate_per_s=20.0,
        idle_s=0.0,
        callers=4,
        crowd_duration_s=1.0,
        workers=4,
    )
    rows = run(settings)

    assert [(row.system, row.delay_ms) for row in rows] == [("msgbus", 0.0), ("msgbus", DELAY_MS)]
    baseline, delayed = rows
    for row in rows:
        assert set(row.cases) == {"back to back", "paced", "open loop"}
        for figures in row.cases.values():
            assert figures["lost"] == 0 and figures["count"] > 0, figures
        assert row.crowd["lost"] == 0 and row.crowd["rpc_per_s"] > 0
    assert delayed.rtt_ms == 2 * DELAY_MS
    assert delayed.rtt_measured_ms >= delayed.rtt_ms
    for case, at_least in (("back to back", 5), ("paced", 3), ("open loop", 15)):
        assert delayed.cases[case]["count"] >= at_least
        assert delayed.cases[case]["p50_ms"] >= delayed.rtt_ms
        assert in_rtts(rows, delayed, case) is not None
    assert in_rtts(rows, baseline, "back to back") is None
    assert "| 10 ms | 20 ms" in latency_table(rows, settings)
    assert crowd_table(rows, settings).count("\n") == 3
    assert not [name for name in list_namespaces() if name.startswith(f"mbn-{os.getpid()}-")]
