"""The harness as a child process for tests and benchmarks: ``python -m testing.many_twins`` started with
the twins asked for, waited for until it serves them, asked for its counts, and stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing.local_sites import free_port, stop_process, wait_until
from testing.many_twins.server import READY_LINE
from testing.many_twins.twins import CONTROL_HOST, TwinRange, twin_entries, twin_signer
from twin_resolver.base import Twin


@dataclass
class ManyTwinsProcess:
    """``python -m testing.many_twins`` as a child process, for tests and benchmarks.

    Its twins are known before it starts (:meth:`twins`), so a site's twin file can hold them from the
    beginning::

        harness = ManyTwinsProcess(count=300, down=50)
        cluster = LocalCluster(size=1, extra_twins=harness.twins()).start()
        harness.start(cluster.twins_file)
    """

    first: int = 1000
    count: int = 100
    down: int = 0
    down_ids: Sequence[int] = ()
    links: bool = True
    reply_bytes: int | None = None
    port: int = field(default_factory=free_port)
    down_port: int = field(default_factory=free_port)
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    _last_log: str = field(default="", repr=False)

    @property
    def range(self) -> TwinRange:
        return TwinRange.of(self.first, self.count, self.down, self.down_ids)

    @property
    def up_ids(self) -> list[int]:
        return self.range.up_ids

    @property
    def down_twin_ids(self) -> list[int]:
        return sorted(self.range.down)

    @property
    def url(self) -> str:
        """Where every twin and the counts are served."""
        return f"http://{CONTROL_HOST}:{self.port}"

    def twins(self) -> list[Twin]:
        """The twin file's entries of the twins, as the process writes them."""
        twins = self.range
        return twin_entries(twins, self.port, self.down_port, {twin: twin_signer(twin) for twin in twins.ids})

    def command(self, twins_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "testing.many_twins", "--twins", str(twins_file),
            "--first", str(self.first), "--count", str(self.count), "--down", str(self.down),
            "--down-ids", ",".join(map(str, self.down_ids)),
            "--port", str(self.port), "--down-port", str(self.down_port),
            *([] if self.links else ["--no-links"]),
            *([] if self.reply_bytes is None else ["--reply-bytes", str(self.reply_bytes)]),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, twins_file: Path, timeout_s: float = 30.0) -> ManyTwinsProcess:
        """Start serving the twins (adding them to ``twins_file`` unless they are there) and wait until
        they take requests."""
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="many-twins-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        with open(self.log_path, "ab") as log_file:
            offset = log_file.tell()
            self.process = subprocess.Popen(
                self.command(twins_file), stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
        wait_until(lambda: self._ready_since(offset), timeout_s, f"{self.count} twins to be served")
        return self

    def stats(self, *, per_twin: bool = False) -> dict[str, Any]:
        """The counts (see :meth:`Counts.as_json`)."""
        # No proxy: the twins are on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}/stats{'?per_twin=1' if per_twin else ''}", timeout=5) as response:
            stats: dict[str, Any] = json.load(response)
        return stats

    def wait_for(
        self, condition: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0, what: str = "the counts"
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
        """What the process wrote (after a clean stop, what it wrote until then)."""
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._last_log

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait; returns the exit status. The log is removed after a clean exit (kept otherwise,
        for whoever looks into what went wrong)."""
        process = self.process
        stop_process(process, timeout_s)
        self.process = None
        if process is not None and process.returncode == 0 and self.log_path is not None:
            self._last_log = self.log()
            self.log_path.unlink(missing_ok=True)
            self.log_path = None
        return process.returncode if process else None

    def _ready_since(self, offset: int) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"many_twins exited with {self.process.returncode}:\n{self.log()}")
        assert self.log_path is not None
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            return READY_LINE.encode() in log_file.read()
