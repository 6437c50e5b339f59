"""The Spark mining job on a standalone cluster against local[*], on the same cores and the same input.

Generates N synthetic events once, starts a Spark standalone master and one worker with all the machine's
cores from the installed PySpark (testing/spark_cluster.py), then runs ``python -m spark.mine`` R times
each way, alternating, and prints each run's wall time (JVM start included) and the ratio of the medians.

    python -m bench.mine_cluster [--events 200000] [--sites 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testing.spark_cluster import StandaloneCluster


def mine(logs: Path, out: Path, master: str, env: dict[str, str] | None) -> float:
    command = [sys.executable, "-m", "spark.mine", "--events", str(logs / "events"), "--backlog"]
    command += [str(logs / "backlog"), "--out", str(out), "--master", master, "--driver-memory", "2g"]
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-5000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="msgbus-mine-cluster-"))
    try:
        logs = workdir / "logs"
        generate = [sys.executable, "-m", "spark.generate", "--events", str(args.events)]
        subprocess.run(
            [*generate, "--sites", str(args.sites), "--out", str(logs)], check=True, capture_output=True
        )
        times: dict[str, list[float]] = {"local[*]": [], "standalone": []}
        cores = os.cpu_count() or 1
        with StandaloneCluster(cores=cores, memory="4g") as cluster:
            for run in range(args.repeats):
                for name, master, env in (
                    ("local[*]", "local[*]", None),
                    ("standalone", cluster.url, cluster.client_env()),
                ):
                    seconds = mine(logs, workdir / "out", master, env)
                    times[name].append(seconds)
                    print(
                        json.dumps({"run": run + 1, "master": name, "seconds": round(seconds, 1)}), flush=True
                    )
        local, standalone = (statistics.median(times[name]) for name in ("local[*]", "standalone"))
        print(
            f"\n{args.events:,} events, {cores} cores: local[*] median {local:.1f} s, standalone cluster "
            f"median {standalone:.1f} s: {standalone / local:.2f}x"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
