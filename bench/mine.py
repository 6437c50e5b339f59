"""The Spark mining job at two sizes: generate synthetic logs, run ``python -m spark.mine`` on them with
``local[*]``, and print the wall time and events per second of each (JVM start included).

    python -m bench.mine [--sizes 1000000,10000000] [--sites 6] [--workdir DIR] [--keep]

The job's cost grows linearly with the events on top of a fixed part (JVM start, planning, the small
jobs of each table): the last line fits ``time = fixed + per_event * events`` through the two sizes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _run(command: list[str]) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return seconds, done.stderr


def measure(events: int, sites: int, folder: Path, master: str, driver_memory: str) -> dict[str, Any]:
    """Generate ``events`` events into ``folder`` and mine them; the figures of both steps."""
    generate = [sys.executable, "-m", "spark.generate", "--events", str(events), "--sites", str(sites)]
    generated_s, _ = _run([*generate, "--out", str(folder), "--malformed-rate", "0.00001"])
    size_mb = sum(path.stat().st_size for path in folder.glob("events/*.jsonl")) / 1e6
    mine = [
        sys.executable,
        "-m",
        "spark.mine",
        "--events",
        str(folder / "events"),
        "--backlog",
        str(folder / "backlog"),
    ]
    mined_s, terminal = _run(
        [*mine, "--out", str(folder / "mined"), "--master", master, "--driver-memory", driver_memory]
    )
    print(terminal, file=sys.stderr, end="", flush=True)
    return {
        "events": events,
        "input_mb": round(size_mb),
        "generate_s": round(generated_s, 1),
        "generate_events_per_s": round(events / generated_s),
        "mine_s": round(mined_s, 1),
        "mine_events_per_s": round(events / mined_s),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| events | input MB | generate s | generate events/s | mine s (wall) | mine events/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['events']:,} | {r['input_mb']:,} | {r['generate_s']} | {r['generate_events_per_s']:,} "
            f"| {r['mine_s']} | {r['mine_events_per_s']:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,10000000", help="comma-separated event counts")
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the logs go (default: a temporary dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated logs and tables")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="msgbus-mine-bench-"))
    rows = []
    for events in (int(size) for size in args.sizes.split(",")):
        folder = workdir / f"events-{events}"
        shutil.rmtree(folder, ignore_errors=True)
        row = measure(events, args.sites, folder, args.master, args.driver_memory)
        print(json.dumps(row), flush=True)
        rows.append(row)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    print(table(rows))
    if len(rows) > 1:
        # time = fixed + per_event * events, through the smallest and the largest size
        first, last = rows[0], rows[-1]
        per_event_s = (last["mine_s"] - first["mine_s"]) / (last["events"] - first["events"])
        fixed_s = first["mine_s"] - per_event_s * first["events"]
        print(
            f"\nmine wall time ~ {fixed_s:.0f} s + {per_event_s * 1e6:.1f} s per million events "
            f"(JVM start, planning and small jobs, then linear in the events)"
        )
    if not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
