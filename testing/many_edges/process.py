"""The edges as a child process for tests and benchmarks: ``python -m testing.many_edges`` started with the
edges asked for, asked for its counts, and stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from testing.local_sites import free_port, stop_process, wait_until
from testing.many_edges.edges import edge_entries
from testing.many_edges.server import READY_LINE
from testing.many_twins.twins import CONTROL_HOST, twin_signer
from twin_resolver.base import Twin


@dataclass
class ManyEdgesProcess:
    """``count`` edges from twin ``first`` keeping uplinks to twin ``cloud``'s site::

    edges = ManyEdgesProcess(cloud=1, count=1000)
    cluster = LocalCluster(size=1, extra_twins=edges.twins()).start()
    edges.start(cluster.twins_file)
    edges.wait_for(lambda stats: stats["open"] == 1000, 60, "every uplink")
    """

    cloud: int
    count: int = 1000
    first: int = 100_000
    reply_bytes: int | None = None
    port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{CONTROL_HOST}:{self.port}"

    @property
    def ids(self) -> range:
        return range(self.first, self.first + self.count)

    def twins(self) -> list[Twin]:
        """The edges' entries in a twin file, as the process writes them (no address)."""
        return edge_entries(self.first, self.count, twin_signer)

    def command(self, twins_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "testing.many_edges",
            "--cloud", str(self.cloud), "--twins", str(twins_file),
            "--first", str(self.first), "--count", str(self.count), "--port", str(self.port),
            *([] if self.reply_bytes is None else ["--reply-bytes", str(self.reply_bytes)]),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, twins_file: Path, timeout_s: float = 60.0) -> ManyEdgesProcess:
        """Start the edges (they dial at once) and wait until their counts are served."""
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="many-edges-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        with open(self.log_path, "ab") as log_file:
            offset = log_file.tell()
            self.process = subprocess.Popen(
                self.command(twins_file), stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
        wait_until(lambda: self._ready_since(offset), timeout_s, f"{self.count} edges to start")
        return self

    def stats(self, *, opened: bool = False) -> dict[str, Any]:
        return self._call("GET", f"/stats{'?opened=1' if opened else ''}")

    def send(self, cmd: str, *, rate_per_s: float = 0.0, count: int | None = None) -> None:
        """Requests from the edges to the cloud's ``cmd``: one from every edge at once (``rate_per_s`` 0),
        or at that rate."""
        query = {"cmd": cmd, "rate": str(rate_per_s), **({} if count is None else {"count": str(count)})}
        self._call("POST", f"/send?{urlencode(query)}")

    def wait_for(
        self, condition: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0, what: str = "the counts"
    ) -> dict[str, Any]:
        """Poll the counts until ``condition`` holds for them; returns them."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.clear()
            seen.update(self.stats())
            return condition(seen)

        wait_until(holds, timeout_s, what)
        return seen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        process = self.process
        stop_process(process, timeout_s)
        self.process = None
        return process.returncode if process else None

    def _call(self, method: str, path: str) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        with opener.open(request, timeout=30) as response:
            answer: dict[str, Any] = json.load(response)
        return answer

    def _ready_since(self, offset: int) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"many_edges exited with {self.process.returncode}:\n{self.log()}")
        assert self.log_path is not None
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            return READY_LINE.encode() in log_file.read()
