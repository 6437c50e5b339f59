"""go-rmb daemons as sites on this machine, each with its own redis-server: the daemon msgbus replaces,
run by the benchmarks side by side with msgbus as a measuring instrument (never part of msgbus).

The builds this expects take an ed25519 seed and a twin file of their own instead of a chain (``--seed``,
``--twins``): ``{"<twin id>": {"ip": "HOST:PORT", "pk": "<hex public key>"}, ...}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from msgbusd.identity.signing import Signer
from testing.local_sites import RedisProcess, free_port, port_open, stop_process, wait_until
from twin_resolver.address import peer_url
from twin_resolver.base import Twin

TWINS_FILE = "go-twins.json"


def go_address(address: str) -> str:
    """A twin address as go-rmb takes it, ``HOST:PORT``: it cannot reach a path under an address (it builds
    ``http://<ip>/zbus-...`` itself), so a base URL is cut to its host and port."""
    return urlsplit(peer_url(address, "/")).netloc


def go_twins(twins: Iterable[Twin]) -> dict[str, dict[str, str]]:
    """go-rmb's twin file's content for ``twins``."""
    return {str(t.id): {"ip": go_address(t.address), "pk": t.public_key.hex()} for t in twins}


def write_go_twin_file(path: Path, twins: Iterable[Twin]) -> None:
    path.write_text(json.dumps(go_twins(twins)))


@dataclass
class GoRmbSite:
    """One go-rmb daemon as twin ``twin``, with a fresh key, a free port and a redis-server of its own (go-rmb
    never deletes answered backlog entries, so each site starts on an empty Redis)."""

    binary: str
    twin: int
    seed: bytes = field(default_factory=lambda: os.urandom(32))
    port: int = field(default_factory=free_port)
    redis: RedisProcess = field(default_factory=RedisProcess)
    process: subprocess.Popen[bytes] | None = None

    @property
    def identity(self) -> Twin:
        """This site's entry in a twin file."""
        public_key = Signer(self.seed, "ed25519").public_key
        return Twin(id=self.twin, address=f"127.0.0.1:{self.port}", public_key=public_key)

    def command(self, twins_file: Path) -> list[str]:
        return [
            self.binary, "--twin", str(self.twin), "--seed", self.seed.hex(), "--twins", str(twins_file),
            "--redis", f"127.0.0.1:{self.redis.port}", "--listen", f"127.0.0.1:{self.port}",
            "--log-level", "error",
        ]  # fmt: skip

    def start(self, twins_file: Path) -> GoRmbSite:
        """Start the Redis and the daemon; :meth:`wait_listening` waits for the daemon."""
        self.redis.start()
        self.process = subprocess.Popen(
            self.command(twins_file), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return self

    def wait_listening(self, timeout_s: float = 20.0) -> None:
        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"go-rmb (twin {self.twin}) exited with status {self.process.returncode}")
            return port_open(self.port)

        wait_until(up, timeout_s, f"go-rmb (twin {self.twin}) on port {self.port}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cleanup(self) -> None:
        stop_process(self.process)
        self.process = None
        self.redis.cleanup()


@contextlib.contextmanager
def go_rmb_sites(binary: str, twins: Sequence[int], others: Sequence[Twin] = ()) -> Iterator[list[GoRmbSite]]:
    """go-rmb sites as ``twins``, listening, all knowing each other and ``others``; stopped on exit."""
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"no go-rmb executable at {binary}")
    workdir = Path(tempfile.mkdtemp(prefix="msgbus-go-rmb-"))
    sites = [GoRmbSite(binary, twin) for twin in twins]
    try:
        write_go_twin_file(workdir / TWINS_FILE, [*(site.identity for site in sites), *others])
        for site in sites:
            site.start(workdir / TWINS_FILE)
        for site in sites:
            site.wait_listening()
        yield sites
    finally:
        for site in sites:
            site.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
