"""The round-trip benchmark's open loop (``bench.rpc --rate``) against two real local sites: the requests due
within the window are sent on their schedule and all answered, and the row says so."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.rpc import run_open_case

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(60)]

RATE_PER_S = 50.0
DURATION_S = 2.0


def test_every_request_due_in_the_window_is_answered_and_counted() -> None:
    args = argparse.Namespace(daemon_arg=None, key_type="ed25519", workers=4, warmup=0.5, duration=DURATION_S)
    row: dict[str, Any] = run_open_case(args, RATE_PER_S, payload=64, fanout=1, floor=False)

    assert (row["system"], row["mode"], row["rate_per_s"]) == ("msgbus", "open", RATE_PER_S)
    assert "clients" not in row
    assert row["lost"] == 0
    # The schedule, not the answers, sets how many are due within the window: R a second of it.
    measured = row["rpc_per_s"] * DURATION_S
    assert 0.9 * RATE_PER_S * DURATION_S <= measured <= 1.1 * RATE_PER_S * DURATION_S, row
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"], row
    assert row["mean_ms"] > 0 and row["sent_late_p99_ms"] >= 0
    roles = {"msgbusd1", "msgbusd2", "redis1", "redis2", "service", "loadgen"}
    assert set(row["cpu_percent"]) == set(row["rss_mib"]) == roles
    assert row["daemon_cpu_ms_per_rpc"] > 0 and row["redis_commands_per_rpc"] > 0
