"""Which process an instance is (machine, boot, pid, start time), so that an instance on the same machine
knows at once that another one's process is gone, without waiting for its lease to run out."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), "" if unknown."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    _, _, after_name = stat.rpartition(")")
    fields = after_name.split()
    return fields[19] if len(fields) > 19 else ""


@dataclass(frozen=True)
class ProcessInfo:
    host: str
    boot: str
    pid: int
    start: str

    @classmethod
    def this(cls) -> ProcessInfo:
        pid = os.getpid()
        return cls(socket.gethostname(), _read(BOOT_ID), pid, start_time(pid))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProcessInfo | None:
        try:
            found = json.loads(text)
            return cls(str(found["host"]), str(found["boot"]), int(found["pid"]), str(found["start"]))
        except (ValueError, KeyError, TypeError):
            return None

    def gone(self) -> bool:
        """True when this process certainly no longer runs: it ran on this machine since its last boot, and
        its pid is free or now belongs to a process started at another time."""
        here = ProcessInfo.this()
        if not self.boot or (self.host, self.boot) != (here.host, here.boot):
            return False
        if self.pid == here.pid:
            return self.start != here.start
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        started = start_time(self.pid)
        return bool(started) and bool(self.start) and started != self.start
