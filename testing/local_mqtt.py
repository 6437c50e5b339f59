"""A private mosquitto broker on a free loopback port, for the tests, the demo and the benchmarks.

Like :class:`testing.local_sites.RedisProcess`: a generated config file in a temporary directory, waits on
the port (never on fixed sleeps), start / stop / restart / kill, and cleans up after itself.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from testing.local_sites import free_port, port_open, stop_process, wait_until

# Debian installs the broker in /usr/sbin, which is not on the PATH of most users.
FALLBACK_BINARY = Path("/usr/sbin/mosquitto")


def mosquitto_binary() -> str:
    """The mosquitto executable; ``RuntimeError`` saying how to install it when there is none."""
    found = shutil.which("mosquitto")
    if found is not None:
        return found
    if os.access(FALLBACK_BINARY, os.X_OK):
        return str(FALLBACK_BINARY)
    raise RuntimeError("mosquitto is not installed: run `make setup` (or apt-get install mosquitto)")


@dataclass
class MosquittoProcess:
    """A mosquitto listening on 127.0.0.1:``port`` only, anonymous clients allowed."""

    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-mosquitto-")))
    # Keep sessions (subscriptions, unacknowledged QoS 1 messages) across a restart: saved on a graceful
    # stop only, so a kill() loses what changed since the start.
    persistence: bool = True
    # Outgoing QoS 1 messages in flight per client (mosquitto's default is 20).
    max_inflight_messages: int = 20
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.workdir / "mosquitto.conf"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mosquitto.log"

    def config(self) -> str:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            # Started as root, mosquitto switches to the `mosquitto` user, which cannot write the workdir.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            f"persistence {'true' if self.persistence else 'false'}",
            f"persistence_location {self.workdir}/",
            f"max_inflight_messages {self.max_inflight_messages}",
            # The default (1000 per client) silently drops QoS 1 messages for a slow or offline subscriber.
            "max_queued_messages 0",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
        ]
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10.0) -> MosquittoProcess:
        """Write the config, start the broker and return once its port accepts connections."""
        self.config_path.write_text(self.config())
        self.process = subprocess.Popen(
            [mosquitto_binary(), "-c", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._accepting, timeout_s, f"mosquitto on port {self.port}")
        return self

    def _accepting(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"mosquitto exited with {self.process.returncode}:\n{self.log()}")
        return port_open(self.port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (mosquitto saves its sessions), wait; SIGKILL if it does not exit in time."""
        process, self.process = self.process, None
        stop_process(process, timeout_s)

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait()

    def restart(self, timeout_s: float = 10.0) -> MosquittoProcess:
        """Stop gracefully and start again on the same port with the same files."""
        self.stop()
        wait_until(lambda: not port_open(self.port), timeout_s, f"port {self.port} to be released")
        return self.start(timeout_s)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
