"""HAProxy in front of a site's processes, as docs/operations.md shows for a site on several machines: TCP
mode (WebSocket upgrades pass as they are), a connection to the process with the fewest, and a process that
refuses connections taken out within two seconds."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testing.local_sites import free_port, port_open, stop_process, wait_until


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise RuntimeError("haproxy is not installed: run `make setup` (or apt-get install haproxy)")
    return found


def haproxy_config(port: int, backends: Sequence[str]) -> str:
    servers = "\n".join(f"    server process{number} {address}" for number, address in enumerate(backends, 1))
    return f"""global
    maxconn 4096

defaults
    mode tcp
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    option redispatch
    retries 2
    default-server check inter 1s fall 2 rise 1

frontend msgbus
    bind 127.0.0.1:{port}
    default_backend msgbusd

backend msgbusd
    balance leastconn
{servers}
"""


@dataclass
class HaproxyProcess:
    backends: Sequence[str]
    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-haproxy-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> HaproxyProcess:
        config = self.workdir / "haproxy.cfg"
        config.write_text(haproxy_config(self.port, self.backends))
        with (self.workdir / "haproxy.log").open("ab") as log:
            self.process = subprocess.Popen(
                [haproxy_binary(), "-db", "-f", str(config)], stdout=log, stderr=log
            )
        wait_until(lambda: port_open(self.port), 20, f"haproxy on {self.port}")
        return self

    def cleanup(self) -> None:
        stop_process(self.process)
        self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)
