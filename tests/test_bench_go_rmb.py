"""The benchmark's side of go-rmb that needs no go-rmb build: its twin file and command line, and msgbus's
rows judged against go-rmb's of the same run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.go_rmb import GoRmbSite, go_address, go_rmb_sites, go_twins, write_go_twin_file
from bench.targets import figures, ratios_table, verdicts
from msgbusd.identity.signing import Signer
from twin_resolver.base import Twin


def test_go_addresses_are_host_and_port() -> None:
    assert go_address("127.0.0.1:18051") == "127.0.0.1:18051"
    assert go_address("http://127.1.0.7:4000/t/1006") == "127.1.0.7:4000"
    assert go_address("10.0.0.2") == "10.0.0.2:8051"
    assert go_address("[300:1::2]:9000") == "[300:1::2]:9000"


def test_the_twin_file_holds_each_site_and_the_other_twins(tmp_path: Path) -> None:
    site = GoRmbSite("/nowhere/go-rmb", twin=1, seed=bytes(range(32)), port=18051)
    other = Twin(id=1000, address="http://127.1.0.1:4000/t/1000", public_key=b"\x07" * 32)
    write_go_twin_file(tmp_path / "twins.json", [site.identity, other])
    assert json.loads((tmp_path / "twins.json").read_text()) == {
        "1": {"ip": "127.0.0.1:18051", "pk": Signer(bytes(range(32)), "ed25519").public_key.hex()},
        "1000": {"ip": "127.1.0.1:4000", "pk": "07" * 32},
    }
    assert go_twins([]) == {}
    site.cleanup()


def test_a_site_runs_with_its_seed_twin_file_redis_and_port(tmp_path: Path) -> None:
    site = GoRmbSite("/opt/go-rmb", twin=2, seed=b"\x01" * 32, port=18052)
    command = site.command(tmp_path / "go-twins.json")
    assert command[0] == "/opt/go-rmb"
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags == {
        "--twin": "2",
        "--seed": "01" * 32,
        "--twins": str(tmp_path / "go-twins.json"),
        "--redis": f"127.0.0.1:{site.redis.port}",
        "--listen": "127.0.0.1:18052",
        "--log-level": "error",
    }
    site.cleanup()


def test_no_build_at_the_path_is_said_before_anything_starts(tmp_path: Path) -> None:
    with (
        pytest.raises(FileNotFoundError, match="no go-rmb executable"),
        go_rmb_sites(str(tmp_path / "x"), [1, 2]),
    ):
        pass


def row(system: str, clients: int, rpc: float, p50: float, cpu: float, lost: int = 0) -> dict[str, Any]:
    return {
        "system": system, "clients": clients, "payload_bytes": 64, "fanout": 1, "rpc_per_s": rpc,
        "p50_ms": p50, "daemon_cpu_ms_per_rpc": cpu, "lost": lost,
    }  # fmt: skip


RUN = [
    row("msgbus", 1, 360.0, 2.66, 2.5),
    row("go-rmb", 1, 300.0, 3.0, 1.8),
    row("msgbus, POSTs", 1, 290.0, 3.4, 3.2),
    row("floor", 1, 600.0, 1.5, 1.5, lost=3),
    row("msgbus", 64, 2000.0, 31.0, 0.48),
    row("go-rmb", 64, 900.0, 60.0, 1.7, lost=2),
]


def test_targets_are_judged_by_the_peer_rows_of_the_same_run() -> None:
    judged = {verdict.target: verdict for verdict in verdicts(RUN)}
    assert list(judged) == [
        "p50 at 1 caller <= half of go-rmb's",
        "RPC/s at 1 caller >= 2x go-rmb",
        "RPC/s at 64 callers >= 2x go-rmb",
        "daemon CPU per round trip, both daemons, 64 callers, <= 0.5 ms",
        "zero lost replies",
    ]
    assert [verdict.met for verdict in judged.values()] == [False, False, True, True, True]
    assert judged["RPC/s at 64 callers >= 2x go-rmb"].measured == "2000.0 against 900.0 (2.22x)"
    # The floor's and go-rmb's losses are not msgbus's.
    assert judged["zero lost replies"].measured == "0 lost in msgbus's rows (go-rmb's rows: 2)"


def test_without_peer_rows_only_the_losses_are_judged() -> None:
    without_peer = [r for r in RUN if r["system"] != "go-rmb"]
    assert [verdict.target for verdict in verdicts(without_peer)] == ["zero lost replies"]
    assert figures(without_peer, "go-rmb", 1) is None


def test_the_ratios_are_msgbus_over_go_rmb_at_each_caller_count() -> None:
    lines = ratios_table(RUN).splitlines()[2:]
    assert lines == [
        "| msgbus | 1 | 1 / 1 | 360.0 | 300.0 | 1.20x | 2.66 | 3.0 | 0.89x | 2.5 | 1.8 | 1.39x |",
        "| msgbus, POSTs | 1 | 1 / 1 | 290.0 | 300.0 | 0.97x | 3.4 | 3.0 | 1.13x | 3.2 | 1.8 | 1.78x |",
        "| msgbus | 64 | 1 / 1 | 2000.0 | 900.0 | 2.22x | 31.0 | 60.0 | 0.52x | 0.48 | 1.7 | 0.28x |",
    ]


def test_rounds_of_one_system_count_by_their_median() -> None:
    rounds = [*RUN, row("go-rmb", 64, 1100.0, 50.0, 1.5), row("go-rmb", 64, 700.0, 70.0, 1.9)]
    assert figures(rounds, "go-rmb", 64) == {"rpc_per_s": 900.0, "p50_ms": 60.0, "daemon_cpu_ms_per_rpc": 1.7}
    assert "| msgbus | 64 | 1 / 3 | 2000.0 | 900.0 | 2.22x |" in ratios_table(rounds)
