"""``msgbus mine --follow`` against event logs written at a set rate: does the stream keep up, and how soon
does an event show in the "now" view?

    python -m bench.follow [--rates 500,2000,8000] [--duration 90] [--rotate 10] [--trigger 5]

For each rate, a writer in this process writes round trips between three sites (eight events each, their
times the wall clock's) as daemons do: each site's lines to ``events-<site>-<start>.jsonl.writing``, named
``.jsonl`` every ``--rotate`` seconds. The job (``python -m spark.mine --follow``, a JVM of its own,
``local[*]``) follows the directory. Every second the bench reads ``now.json``: how old the newest event
in the view is (the time from an event being written to its showing in the view, rotation included), and
how long the micro-batches take. One JSON line per rate: ``keeps_up`` is true when the view's age stayed
bounded (its last third no higher than its first third plus one rotation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

from wire import event_schema as ev

HOPS_US = (0, 1200, 1500, 1600, 4000, 5000, 5300, 5400)
STEPS = (
    (ev.ACCEPTED, "src"),
    (ev.SENT, "src"),
    (ev.RECEIVED, "dst"),
    (ev.HANDED_TO_SERVICE, "dst"),
    (ev.REPLY_TAKEN, "dst"),
    (ev.REPLY_SENT, "dst"),
    (ev.REPLY_RECEIVED, "src"),
    (ev.DELIVERED, "src"),
)


def round_trip_lines(n: int, now_us: int) -> dict[int, list[str]]:
    """The eight events of request ``n`` (site 1 to site 2 or 3), by the site that writes them."""
    src, dst = 1, 2 + n % 2
    lines: dict[int, list[str]] = {src: [], dst: []}
    for (name, side), offset in zip(STEPS, HOPS_US, strict=True):
        site = src if side == "src" else dst
        line = {ev.TS: now_us + offset, ev.SITE: site, ev.HOST: "h", ev.EVENT: name, ev.UID: f"{dst}.{n}"}
        line.update({ev.CMD: "bench.echo", ev.SRC: src, ev.DST: dst})
        lines[site].append(json.dumps(line))
    return lines


class Writer(threading.Thread):
    """Writes ``rate`` events a second to ``folder``, a new file per site every ``rotate_s``."""

    def __init__(self, folder: Path, rate: float, rotate_s: float, duration_s: float) -> None:
        super().__init__(daemon=True)
        self.folder, self.rate, self.rotate_s, self.duration_s = folder, rate, rotate_s, duration_s
        self.written = 0

    def run(self) -> None:
        began = time.monotonic()
        files: dict[int, Any] = {}
        opened = time.monotonic()
        n = 0
        while time.monotonic() - began < self.duration_s:
            if time.monotonic() - opened >= self.rotate_s:
                self._complete(files)
                opened = time.monotonic()
            due = int((time.monotonic() - began) * self.rate / len(STEPS))
            while n < due:
                for site, lines in round_trip_lines(n, int(time.time() * 1e6)).items():
                    if site not in files:
                        files[site] = open(self._path(site) + ".writing", "a")  # noqa: SIM115
                    files[site].write("\n".join(lines) + "\n")
                n += 1
                self.written += len(STEPS)
            for file in files.values():
                file.flush()
            time.sleep(0.05)
        self._complete(files)

    def _path(self, site: int) -> str:
        return str(self.folder / f"events-{site}-{time.time_ns()}.jsonl")

    def _complete(self, files: dict[int, Any]) -> None:
        for file in files.values():
            file.close()
            os.replace(file.name, file.name.removesuffix(".writing"))
        files.clear()


def view_age_s(out: Path) -> tuple[float, dict[str, Any]] | None:
    try:
        view = json.loads((out / "now.json").read_text())
    except (OSError, ValueError):
        return None
    newest = datetime.fromisoformat(view["as_of"]).timestamp()
    return time.time() - newest, view["progress"]


def measure(
    rate: float, duration_s: float, rotate_s: float, trigger_s: float, workdir: Path
) -> dict[str, Any]:
    logs, out = workdir / "logs", workdir / "out"
    logs.mkdir(parents=True)
    command = [sys.executable, "-m", "spark.mine", "--follow", "--events", str(logs), "--out", str(out)]
    command += ["--trigger", str(trigger_s), "--watermark", str(3 * rotate_s), "--driver-memory", "2g"]
    with open(workdir / "follow.log", "wb") as log:
        follower = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        writer = Writer(logs, rate, rotate_s, duration_s)
        writer.start()
        ages: list[float] = []
        batches: dict[int, float] = {}
        while writer.is_alive():
            time.sleep(1)
            seen = view_age_s(out)
            if seen is not None:
                ages.append(seen[0])
                batches[int(seen[1]["batch"])] = float(seen[1]["batch_s"])
        third = max(1, len(ages) // 3)
        settled = list(batches.values())[1:] or list(batches.values())
        return {
            "rate_events_per_s": rate,
            "written": writer.written,
            "rotate_s": rotate_s,
            "trigger_s": trigger_s,
            "view_age_p50_s": round(median(ages), 1) if ages else None,
            "view_age_max_s": round(max(ages), 1) if ages else None,
            "view_age_first_third_s": round(median(ages[:third]), 1) if ages else None,
            "view_age_last_third_s": round(median(ages[-third:]), 1) if ages else None,
            "batches": len(batches),
            "batch_s_median": round(median(settled), 2) if settled else None,
            "keeps_up": bool(ages) and median(ages[-third:]) <= median(ages[:third]) + rotate_s,
        }
    finally:
        follower.terminate()
        follower.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="500,2000,8000", help="events per second, comma-separated")
    p.add_argument("--duration", type=float, default=90.0, help="seconds of writing per rate")
    p.add_argument("--rotate", type=float, default=10.0, help="the writer's rotation period, seconds")
    p.add_argument("--trigger", type=float, default=5.0, help="the stream's trigger, seconds")
    args = p.parse_args(argv)
    for rate in (float(r) for r in args.rates.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix="msgbus-bench-follow-"))
        try:
            print(json.dumps(measure(rate, args.duration, args.rotate, args.trigger, workdir)), flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
