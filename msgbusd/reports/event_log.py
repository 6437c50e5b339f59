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

Writing never stops the daemon. A write that fails (a full disk, a file system gone read-only, permissions,
an I/O error, the file removed with its directory) drops its events; the file it was writing is cut after
its last whole line, closed and named, and the next write starts a new file, making the directory again if
need be: writing resumes by itself once it can. A directory that cannot be made at start is tried again in
the same way. Events wait in memory for the writer up to ``max_pending``; beyond, they are dropped too
(writes do not keep up). :mod:`msgbusd.reports.event_log_drops` counts the drops and says so.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from io import FileIO
from pathlib import Path
from typing import IO, Any

import orjson

from msgbusd.reports.event_log_drops import Drops
from msgbusd.reports.metrics import Metrics
from wire import event_schema as ev
from wire.backoff import sleep_unless
from wire.envelope import Envelope, payload_size

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
WRITING_SUFFIX = ".writing"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_ROTATE_S = 3600.0
# Events waiting for the writer at most: several seconds of a busy site's events.
MAX_PENDING_EVENTS = 65_536

_Pending = tuple[float, str, Envelope | None, dict[str, Any]]


@dataclass
class _Flushed:
    """What one write did, settled on the event loop after it."""

    written: int = 0
    failures: list[tuple[OSError, int]] = field(default_factory=list)


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
        max_pending: int = MAX_PENDING_EVENTS,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.directory = directory
        self.enabled = directory is not None
        self._site = site
        self._host = host or socket.gethostname()
        self._max_bytes = max_bytes
        self._rotate_s = rotate_s
        self._clock = clock
        self._max_pending = max_pending
        self._flush_interval_s = flush_interval_s
        self._pending: list[_Pending] = []
        self._file: FileIO | None = None
        self._file_path: Path | None = None
        self._file_started = 0.0
        self._file_bytes = 0
        self._file_events = 0
        # A file was given up (or the directory could not be made): complete what it left before the next.
        self._repair = False
        self.written = 0
        self.drops = Drops(directory or Path(), clock=clock, metrics=metrics)
        if directory is not None:
            try:
                make_directory(directory)
                finish_left_over(directory)
            except OSError as exc:
                self._repair = True
                self.drops.failed(exc, 0)
                self.drops.report()

    def emit(
        self, event: str, env: Envelope | None = None, /, *, at: float | None = None, **fields: Any
    ) -> None:
        """Record ``event``, as of now or of time ``at``. ``uid``, ``cmd``, ``src``, ``dst`` (its first) and
        ``bytes`` come from ``env`` unless given in ``fields``; fields that are None are left out."""
        if not self.enabled:
            return
        if len(self._pending) < self._max_pending:
            self._pending.append((self._clock() if at is None else at, event, env, fields))
        else:
            self.drops.dropped("behind", "events come faster than they are written", 1)
            self.drops.report()

    async def run(self, stopping: asyncio.Event) -> None:
        """Write what piled up every ``flush_interval_s`` until ``stopping``; then call :meth:`close`."""
        if not self.enabled:
            return
        while not stopping.is_set():
            await sleep_unless(stopping, self._flush_interval_s)
            batch = self._take()
            if batch or self._file_due(self._clock()):
                try:
                    self._settle(await asyncio.to_thread(self._write, batch))
                except Exception as exc:  # a fault of the log's own (an event it cannot encode) included
                    log.exception("the event log dropped %d event(s) it could not write", len(batch))
                    self.drops.dropped("other", str(exc) or type(exc).__name__, len(batch))
            self.drops.report()

    def flush(self) -> None:
        """Write what piled up now, in this thread (:meth:`run` writes in a worker thread)."""
        if self.enabled:
            self._settle(self._write(self._take()))
            self.drops.report()

    def close(self) -> None:
        """Write everything still pending, close the file and give it its name."""
        if not self.enabled:
            return
        self._settle(self._write(self._take()))
        self._finish()
        self.drops.report(final=True)

    def _take(self) -> list[_Pending]:
        batch, self._pending = self._pending, []
        return batch

    def _settle(self, flushed: _Flushed) -> None:
        for exc, count in flushed.failures:
            self.drops.failed(exc, count)
        if flushed.written:
            self.drops.written()

    def _write(self, batch: list[_Pending]) -> _Flushed:
        """Append ``batch``; a file that is due is completed first, even with nothing to append (a reader
        waits for it). Raises no ``OSError``: what could not be written is in the answer."""
        flushed = _Flushed()
        if self.directory is None:
            return flushed
        if (lost := self._removed()) is not None:
            flushed.failures.append(lost)
        now = self._clock()
        if self._file_due(now):
            self._finish()
        if not batch:
            return flushed
        text = b"".join(self._line(*pending) for pending in batch)
        try:
            if self._file is None:
                self._open_next(now)
            self._append(text)
        except OSError as exc:
            flushed.failures.append((exc, len(batch)))
            self._give_up()
            return flushed
        self._file_events += len(batch)
        self.written += len(batch)
        flushed.written = len(batch)
        return flushed

    def _append(self, text: bytes) -> None:
        assert self._file is not None
        view = memoryview(text)
        # A write may take only part of it (the disk filling up); the next one then fails.
        while view:
            view = view[self._file.write(view) :]
        self._file_bytes += len(text)

    def _removed(self) -> tuple[OSError, int] | None:
        """The events of the current file if it was removed (its directory with it): they are lost, though
        writing to it still works."""
        if self._file is None or self._file_path is None:
            return None
        try:
            if os.fstat(self._file.fileno()).st_nlink:
                return None
        except OSError:
            return None
        lost = self._file_events
        gone = f"{os.strerror(errno.ENOENT)}: {self._file_path.name} was removed while it was written"
        self._give_up()
        return FileNotFoundError(errno.ENOENT, gone), lost

    def _give_up(self) -> None:
        """Close the current file after a failed write: cut what the write left of an unfinished line, and
        name the file. Where even that fails, it stays ``.writing`` for :func:`finish_left_over`."""
        file, path, whole = self._file, self._file_path, self._file_bytes
        self._file = self._file_path = None
        self._repair = True
        if file is None or path is None:
            return
        try:
            os.ftruncate(file.fileno(), whole)
        except OSError:
            whole = -1
        with suppress(OSError):
            file.close()
        with suppress(OSError):
            if whole > 0:
                os.replace(path, completed_name(path))
            elif whole == 0:
                path.unlink()

    def _file_due(self, now: float) -> bool:
        return self._file is not None and (
            self._file_bytes >= self._max_bytes or now - self._file_started >= self._rotate_s
        )

    def _open_next(self, now: float) -> None:
        assert self.directory is not None
        # Made again if it was removed since.
        make_directory(self.directory)
        if self._repair:
            finish_left_over(self.directory)
            self._repair = False
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S%f")
        path = self.directory / f"events-{self._site}-{stamp}.jsonl{WRITING_SUFFIX}"
        # Kept open across writes; completed on rotation and by close(). Unbuffered: a write that fails
        # leaves nothing to be written at close, and what it wrote of its batch is cut (_give_up).
        file = open(path, "ab", buffering=0)  # noqa: SIM115
        try:
            # Held while this process writes it: a file whose lock is free was left by a writer that is gone.
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.close()
            raise
        self._file = file
        self._file_path = path
        self._file_started = now
        self._file_bytes = self._file_events = 0

    def _finish(self) -> None:
        file, path = self._file, self._file_path
        if file is None or path is None:
            return
        self._file = self._file_path = None
        try:
            file.close()
            os.replace(path, completed_name(path))
        except OSError:
            # Left ``.writing``, completed (cut after its last whole line) before the next file is opened.
            self._repair = True

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


def make_directory(directory: Path) -> None:
    """Make ``directory`` and its parents unless it is there; a file in its place is not a directory
    (rather than "File exists", which would tell its operator less)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory)) from exc


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
