"""Print the figures of a fault run (JSON lines from $MSGBUS_FAULT_REPORT) as a Markdown table."""

from __future__ import annotations

import json
import sys


def table(lines: list[str]) -> str:
    rows = [
        "| scenario | requests | outcomes (expected) | ok | errors | lost | duplicate outcomes "
        "| executed twice | time | last answer after recovery |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        r = json.loads(line)
        errors = ", ".join(f"{kind}: {n}" for kind, n in r["errors"].items()) or "none"
        # Only the recovery scenarios measure it.
        recovery = f"{r['recovery_s']} s" if r.get("recovery_s") is not None else "–"
        rows.append(
            f"| {r['scenario']} | {r['requests']} | {r['outcomes']} ({r['expected_outcomes']}) | {r['ok']} | "
            f"{errors} | {r['lost']} | {r['duplicate_outcomes']} | {r['executed_twice']} | {r['seconds']} s "
            f"| {recovery} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    with open(sys.argv[1]) as source:
        print(table([line for line in source if line.strip()]))
