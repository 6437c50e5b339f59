"""msgbus against go-rmb from the rows of one sweep: the ratios, and each target met or not.

Every go-rmb figure a target is judged by comes from the same run as msgbus's (the machine's speed moves
by a third from one run to the next, so a figure from another run would judge the day, not the daemon).
Rows are :func:`bench.rpc.run_case`'s; the rows compared are those of 64-byte payloads and one destination,
and where a system has several at one caller count (alternating rounds), their median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PEER = "go-rmb"
# The systems compared with the peer: over links (between msgbus sites), and with POSTs (as to go-rmb).
OURS = ("msgbus", "msgbus, POSTs")
PAYLOAD_BYTES = 64
# A round trip's daemon CPU (both daemons) at 64 callers may be this much at most.
CPU_MS_PER_RPC = 0.5
FIGURES = ("rpc_per_s", "p50_ms", "daemon_cpu_ms_per_rpc")

Row = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """One target, what was measured, and whether it is met."""

    target: str
    measured: str
    met: bool


def rows_of(rows: Sequence[Row], system: str, clients: int) -> list[Row]:
    """The rows of ``system`` at ``clients`` callers, 64-byte payloads and one destination."""
    wanted = (system, clients, PAYLOAD_BYTES, 1)
    return [
        row for row in rows if (row["system"], row["clients"], row["payload_bytes"], row["fanout"]) == wanted
    ]


def figures(rows: Sequence[Row], system: str, clients: int) -> dict[str, float] | None:
    """The median of each figure over :func:`rows_of`; None when the run has no such row."""
    found = rows_of(rows, system, clients)
    if not found:
        return None
    return {key: round(statistics.median(row[key] for row in found), 3) for key in FIGURES}


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "–"


def ratios_table(rows: Sequence[Row]) -> str:
    """msgbus's figures over go-rmb's, at each caller count the run has both of (Markdown)."""
    lines = [
        "| system | callers | rows | RPC/s | go-rmb RPC/s | ratio | p50 ms | go-rmb p50 ms | ratio "
        "| daemon CPU ms/RPC | go-rmb daemon CPU ms/RPC | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for clients in sorted({row["clients"] for row in rows if row["system"] == PEER}):
        peer = figures(rows, PEER, clients)
        for system in OURS:
            ours = figures(rows, system, clients)
            if ours is None or peer is None:
                continue
            counts = f"{len(rows_of(rows, system, clients))} / {len(rows_of(rows, PEER, clients))}"
            cells: list[object] = [system, clients, counts]
            for key in FIGURES:
                cells += [ours[key], peer[key], ratio(ours[key], peer[key])]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def verdicts(rows: Sequence[Row]) -> list[Verdict]:
    """The targets, judged by msgbus's rows (over links) and go-rmb's of the same run."""
    found: list[Verdict] = []
    one, peer_one = figures(rows, "msgbus", 1), figures(rows, PEER, 1)
    if one is not None and peer_one is not None:
        mine, theirs = one["p50_ms"], peer_one["p50_ms"]
        found.append(
            Verdict(
                "p50 at 1 caller <= half of go-rmb's",
                f"{mine} ms against {theirs} ms ({ratio(mine, theirs)})",
                mine <= theirs / 2,
            )
        )
    for clients in (1, 64):
        ours, peer = figures(rows, "msgbus", clients), figures(rows, PEER, clients)
        if ours is None or peer is None:
            continue
        mine, theirs = ours["rpc_per_s"], peer["rpc_per_s"]
        found.append(
            Verdict(
                f"RPC/s at {clients} caller{'s' if clients > 1 else ''} >= 2x go-rmb",
                f"{mine} against {theirs} ({ratio(mine, theirs)})",
                mine >= 2 * theirs,
            )
        )
    busy, peer_busy = figures(rows, "msgbus", 64), figures(rows, PEER, 64)
    if busy is not None and peer_busy is not None:
        mine, theirs = busy["daemon_cpu_ms_per_rpc"], peer_busy["daemon_cpu_ms_per_rpc"]
        found.append(
            Verdict(
                f"daemon CPU per round trip, both daemons, 64 callers, <= {CPU_MS_PER_RPC} ms",
                f"{mine} ms (go-rmb {theirs} ms, {ratio(mine, theirs)})",
                mine <= CPU_MS_PER_RPC,
            )
        )
    lost = sum(row["lost"] for row in rows if row["system"].startswith("msgbus"))
    peer_lost = sum(row["lost"] for row in rows if row["system"] == PEER)
    found.append(
        Verdict("zero lost replies", f"{lost} lost in msgbus's rows (go-rmb's rows: {peer_lost})", lost == 0)
    )
    return found


def verdicts_table(rows: Sequence[Row]) -> str:
    lines = ["| target | measured in this run | met |", "|---|---|---|"]
    for verdict in verdicts(rows):
        lines.append(f"| {verdict.target} | {verdict.measured} | {'yes' if verdict.met else 'no'} |")
    return "\n".join(lines)
