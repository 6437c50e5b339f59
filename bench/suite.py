"""``make bench``: the whole sweep in one run, as JSON lines and then one Markdown table.

Concurrency 1, 16 and 64 with 64-byte payloads (msgbus over links, msgbus with links refused so that
the sites send POSTs as to go-rmb, and the no-logic floor; at 64 also with both daemons writing their
event logs), 64 KiB and 1 MiB payloads, a fan-out of one request to 50
destinations, and a backlog of pending requests (memory held, expiry speed).
Every figure comes from this one run on this machine, so ratios between rows are what to compare.

``--peer-bin GO_RMB`` adds rows of two go-rmb daemons of that build as the sites, with the same callers and
service, at 1 and 64 callers (64-byte payloads): msgbus's row and go-rmb's there run ``--peer-rounds`` times
each, taking turns at going first, then msgbus's figures over go-rmb's and the targets met or not
(:mod:`bench.targets`), all from this run.

    python -m bench.suite [--duration S] [--backlog N] [--peer-bin GO_RMB [--peer-rounds N] [--peer-only]]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from bench.rpc import run_case
from bench.targets import ratios_table, verdicts_table

CASES: list[tuple[int, int, int, bool, bool, bool]] = [
    # (clients, payload bytes, fan-out, floor, event log, links)
    (1, 64, 1, False, False, True),
    (1, 64, 1, False, False, False),
    (1, 64, 1, True, False, True),
    (16, 64, 1, False, False, True),
    (16, 64, 1, False, False, False),
    (16, 64, 1, True, False, True),
    (64, 64, 1, False, False, True),
    (64, 64, 1, False, False, False),
    (64, 64, 1, False, True, True),
    (64, 64, 1, True, False, True),
    (1, 64 * 1024, 1, False, False, True),
    (1, 64 * 1024, 1, False, False, False),
    (16, 64 * 1024, 1, False, False, True),
    (64, 64 * 1024, 1, False, False, True),
    (1, 1024 * 1024, 1, False, False, True),
    (1, 1024 * 1024, 1, False, False, False),
    (16, 1024 * 1024, 1, False, False, True),
    (16, 64, 50, False, False, True),
]
# With --peer-bin, these rows alternate with go-rmb's.
PEER_CASES = {(1, 64, 1, False, False, True), (64, 64, 1, False, False, True)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| system | clients | payload | fan-out | RPC/s | p50 ms | p99 ms | lost | daemon CPU ms/RPC "
        "| all CPU ms/RPC | Redis commands/RPC |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        size = _size(r["payload_bytes"])
        lines.append(
            f"| {r['system']} | {r['clients']} | {size} | {r['fanout']} | {r['rpc_per_s']} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['lost']} | {r['daemon_cpu_ms_per_rpc']} | {r['total_cpu_ms_per_rpc']} "
            f"| {r.get('redis_commands_per_rpc', '–')} |"
        )
    return "\n".join(lines)


def case_rows(
    case_args: argparse.Namespace,
    case: tuple[int, int, int, bool, bool, bool],
    peer_bin: str | None,
    rounds: int,
) -> Iterator[dict[str, Any]]:
    """The case's row; with ``peer_bin`` and a case of ``PEER_CASES``, msgbus's and go-rmb's ``rounds`` times
    each, msgbus first, then go-rmb first, and so on: the machine's speed drifting during the run weighs on
    both alike."""
    clients, payload, fanout, floor, event_log, links = case
    if not peer_bin or case not in PEER_CASES:
        yield run_case(case_args, clients, payload, fanout, floor, event_log, links)
        return
    for number in range(rounds):
        for peer in (None, peer_bin) if number % 2 == 0 else (peer_bin, None):
            yield run_case(case_args, clients, payload, fanout, floor, event_log, links, peer_bin=peer)


def run_backlog(requests: int) -> str:
    command = [sys.executable, "-m", "bench.backlog", str(requests)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def _size(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n // (1024 * 1024)} MiB"
    if n >= 1024:
        return f"{n // 1024} KiB"
    return f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also measure two go-rmb daemons of this build")
    parser.add_argument("--peer-rounds", type=int, default=2, help="msgbus/go-rmb rows per caller count")
    parser.add_argument(
        "--peer-only",
        action="store_true",
        help="only the rows compared with go-rmb (no other case, no backlog)",
    )
    args = parser.parse_args()
    if args.peer_only and not args.peer_bin:
        parser.error("--peer-only needs --peer-bin")
    case_args = argparse.Namespace(
        duration=args.duration, warmup=args.warmup, workers=16, key_type="ed25519", daemon_arg=[]
    )
    cases = [case for case in CASES if case in PEER_CASES] if args.peer_only else CASES
    rows = []
    for case in cases:
        for row in case_rows(case_args, case, args.peer_bin, args.peer_rounds):
            print(json.dumps(row), flush=True)
            rows.append(row)
    backlog = None if args.peer_only else run_backlog(args.backlog)
    if backlog is not None:
        print(backlog, flush=True)
    print()
    print(table(rows))
    if backlog is not None:
        print()
        print("backlog:", backlog)
    if args.peer_bin:
        print()
        print(ratios_table(rows))
        print()
        print(verdicts_table(rows))


if __name__ == "__main__":
    main()
