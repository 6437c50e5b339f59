"""The event log: one JSON line per step of a message's life, for ``msgbus mine`` (see docs/events.md).

:meth:`EventLog.emit` only appends to a list in memory. A background task hands what piled up to a thread
every half second, which turns it into lines and appends them to the current file; a file is closed and a new
one started when it reaches its size limit or its age limit. Stopping writes everything still pending, so a
graceful shutdown loses nothing; a killed daemon loses at most the last half second of events (the messages
themselves are safe in Redis; only their history is incomplete).

A file being written is named ``events-<twin>-<start>.jsonl.writing`` and locked; it takes its name
``events-<twin>-<start>.jsonl`` when it is complete, so that a reader of ``*.jsonl`` that follows the
directory never reads a file half-written. A daemon killed while writing leaves its ``.writing`` file;
the next event log opened on the directory cuts it after its last whole line and names it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from wire import event_schema as ev
from wire.backoff import sleep_unless
from wire.envelope import Envelope, payload_size

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
WRITING_SUFFIX = ".writing"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_ROTATE_S = 3600.0

_Pending = tuple[float, str, Envelope | None, dict[str, Any]]


class EventLog:
    """Events of one site. Disabled (every call does nothing) when ``directory`` is None."""

    def __init__(
        self,
        directory: Path | None,
        site: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        rotate_s: float = DEFAULT_ROTATE_S,
        clock: Callable[[], float] = time.time,
        host: str | None = None,
    ) -> None:
        self.directory = directory
        self.enabled = directory is not None
        self._site = site
        self._host = host or socket.gethostname()
        self._max_bytes = max_bytes
        self._rotate_s = rotate_s
        self._clock = clock
        self._pending: list[_Pending] = []
        self._file: IO[bytes] | None = None
        self._file_path: Path | None = None
        self._file_started = 0.0
        self._file_bytes = 0
        self.written = 0
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            finish_left_over(directory)

    def emit(
        self, event: str, env: Envelope | None = None, /, *, at: float | None = None, **fields: Any
    ) -> None:
        """Record ``event``, as of now or of time ``at``. ``uid``, ``cmd``, ``src``, ``dst`` (its first) and
        ``bytes`` come from ``env`` unless given in ``fields``; fields that are None are left out."""
        if self.enabled:
            self._pending.append((self._clock() if at is None else at, event, env, fields))

    async def run(self, stopping: asyncio.Event) -> None:
        """Write what piled up every :data:`FLUSH_INTERVAL_S` until ``stopping``; then call :meth:`close`."""
        if not self.enabled:
            return
        while not stopping.is_set():
            await sleep_unless(stopping, FLUSH_INTERVAL_S)
            batch = self._take()
            if batch or self._file_due(self._clock()):
                await asyncio.to_thread(self._write, batch)

    def close(self) -> None:
        """Write everything still pending, close the file and give it its name."""
        self._write(self._take())
        self._finish()

    def _take(self) -> list[_Pending]:
        batch, self._pending = self._pending, []
        return batch

    def _write(self, batch: list[_Pending]) -> None:
        """Append ``batch``; a file that is due is completed first, even with nothing to append (a reader
        waits for it)."""
        now = self._clock()
        if self._file_due(now):
            self._finish()
        if not batch or self.directory is None:
            return
        text = b"".join(self._line(*pending) for pending in batch)
        if self._file is None:
            self._open_next(now)
        assert self._file is not None
        self._file.write(text)
        self._file.flush()
        self._file_bytes += len(text)
        self.written += len(batch)

    def _file_due(self, now: float) -> bool:
        return self._file is not None and (
            self._file_bytes >= self._max_bytes or now - self._file_started >= self._rotate_s
        )

    def _open_next(self, now: float) -> None:
        assert self.directory is not None
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S%f")
        path = self.directory / f"events-{self._site}-{stamp}.jsonl{WRITING_SUFFIX}"
        # Kept open across writes; completed on rotation and by close().
        self._file = open(path, "ab")  # noqa: SIM115
        # Held while this process writes it: a file whose lock is free was left by a writer that is gone.
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file_path = path
        self._file_started = now
        self._file_bytes = 0

    def _finish(self) -> None:
        if self._file is None or self._file_path is None:
            return
        self._file.close()
        os.replace(self._file_path, completed_name(self._file_path))
        self._file = self._file_path = None

    def _line(self, ts: float, event: str, env: Envelope | None, fields: dict[str, Any]) -> bytes:
        entry: dict[str, Any] = {ev.TS: int(ts * 1_000_000), ev.SITE: self._site, ev.HOST: self._host}
        entry[ev.EVENT] = event
        if env is not None:
            entry[ev.UID] = env.uid
            entry[ev.CMD] = env.cmd
            entry[ev.SRC] = env.src
            if env.dst:
                entry[ev.DST] = env.dst[0]
            entry[ev.BYTES] = payload_size(env.dat)
        for name, value in fields.items():
            if value is not None:
                entry[name] = value
        return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)


def completed_name(writing: Path) -> Path:
    """``events-1-T.jsonl.writing`` -> ``events-1-T.jsonl``."""
    return writing.with_name(writing.name.removesuffix(WRITING_SUFFIX))


def finish_left_over(directory: Path) -> int:
    """Complete the files in ``directory`` that a writer left ``.writing`` when it was killed (their lock
    is free): cut after the last whole line, then name them (one left empty is removed). Returns how many."""
    finished = 0
    for path in sorted(directory.glob(f"events-*.jsonl{WRITING_SUFFIX}")):
        try:
            with open(path, "r+b") as file:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its writer is alive
                if not path.exists():
                    continue  # completed by another process meanwhile
                size = file.seek(0, os.SEEK_END)
                whole = _end_of_last_line(file, size)
                if whole < size:
                    file.truncate(whole)
                if whole:
                    os.replace(path, completed_name(path))
                else:
                    path.unlink()
        except FileNotFoundError:
            continue
        finished += 1
        cut = size - whole
        log.warning(
            "completed the event log file %s left by a writer that stopped%s",
            completed_name(path).name if whole else f"{path.name} (empty, removed)",
            f"; its last {cut} byte(s), an unfinished line, were dropped" if cut else "",
        )
    return finished


def _end_of_last_line(file: IO[bytes], size: int) -> int:
    """The offset just after the last newline of ``file`` (0 if it has none), reading from its end."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        file.seek(start)
        newline = file.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0
