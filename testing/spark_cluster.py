"""A Spark standalone cluster on this machine, started from the installed PySpark: one master and one
worker, on free loopback ports, their logs and work files in a temporary directory.

    with StandaloneCluster(cores=2) as cluster:
        python -m spark.mine --master cluster.url ...   (with cluster.client_env())

The same commands start a real cluster by hand (docs/mining.md): PySpark ships ``bin/spark-class``, and the
master and worker need nothing but Java.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from spark.jit import C1_ONLY
from testing.local_sites import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 60.0


def spark_home() -> Path:
    """The installed PySpark's directory: it holds ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class StandaloneCluster:
    cores: int = 2
    memory: str = "2g"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-spark-")))
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    worker_port: int = field(default_factory=free_port)
    worker_ui_port: int = field(default_factory=free_port)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def conf_dir(self) -> Path:
        """A SPARK_CONF_DIR for clients: no driver UI (ports), everything on loopback."""
        return self.workdir / "conf"

    def client_env(self) -> dict[str, str]:
        """The environment for a driver of this cluster (``python -m spark.mine``, ``spark-submit``)."""
        return os.environ | {"SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": "127.0.0.1"}

    def start(self) -> StandaloneCluster:
        if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
            raise RuntimeError(
                "Spark needs a Java runtime: run `make setup` (or apt-get install openjdk-17-jre)"
            )
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
        self._launch(
            "master",
            [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.master_port)],
            ["--webui-port", str(self.master_ui_port)],
        )
        self._wait_for(lambda: self.state().get("status") == "ALIVE", "the master")
        self._launch(
            "worker",
            [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(self.worker_port)],
            [
                "--webui-port",
                str(self.worker_ui_port),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.workdir / "work"),
                self.url,
            ],
        )
        self._wait_for(lambda: bool(self.state().get("aliveworkers")), "the worker to register")
        return self

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's JSON): workers, running and completed applications."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=2) as answer:
                return dict(json.load(answer))
        except (OSError, ValueError):
            # Not up yet, or its web UI answered with a page rather than the JSON (seen while it starts).
            return {}

    def completed_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("completedapps", []))

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.cleanup()

    def _launch(self, role: str, main: list[str], args: list[str]) -> None:
        home = spark_home()
        env = os.environ | {
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.workdir),
            # The master's REST submission server would take port 6066 on every cluster.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # The master and the worker only schedule and start executors: C1 alone, as for a cluster's
            # driver (spark.jit).
            "SPARK_DAEMON_JAVA_OPTS": C1_ONLY,
        }
        with open(self.workdir / f"{role}.log", "wb") as log_file:
            self._processes.append(
                subprocess.Popen(
                    [str(home / "bin" / "spark-class"), *main, *args],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark process exited with {process.returncode}:\n{self._logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not start in {START_TIMEOUT_S:.0f}s:\n{self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.workdir.glob("*.log")
        )
