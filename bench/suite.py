"""``make bench``: the whole sweep in one run, as JSON lines and then one Markdown table.

Concurrency 1, 16 and 64 with 64-byte payloads (msgbus over links, msgbus with links refused so that
the sites send POSTs as to go-rmb, and the no-logic floor; at 64 also with both daemons writing their
event logs), 64 KiB and 1 MiB payloads, a fan-out of one request to 50
destinations, and a backlog of pending requests (memory held, expiry speed).
Every figure comes from this one run on this machine, so ratios between rows are what to compare.

    python -m bench.suite [--duration S] [--backlog N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from bench.rpc import run_case

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
    args = parser.parse_args()
    case_args = argparse.Namespace(
        duration=args.duration, warmup=args.warmup, workers=16, key_type="ed25519", daemon_arg=[]
    )
    rows = []
    for clients, payload, fanout, floor, event_log, links in CASES:
        row = run_case(case_args, clients, payload, fanout, floor, event_log, links)
        print(json.dumps(row), flush=True)
        rows.append(row)
    backlog = subprocess.run(
        [sys.executable, "-m", "bench.backlog", str(args.backlog)], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(backlog, flush=True)
    print()
    print(table(rows))
    print()
    print("backlog:", backlog)


if __name__ == "__main__":
    main()
