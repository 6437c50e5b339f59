"""The event log: one JSON line per step of a message's life, for ``msgbus mine`` (see docs/events.md).

:meth:`EventLog.emit` only appends to a list in memory. A background task hands what piled up to a thread
every half second, which turns it into lines and appends them to the current file; a file is closed and a new
one started when it reaches its size limit or its age limit. Stopping writes everything still pending, so a
graceful shutdown loses nothing; a killed daemon loses at most the last half second of events (the messages
themselves are safe in Redis; only their history is incomplete).
"""

from __future__ import annotations

import asyncio
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

FLUSH_INTERVAL_S = 0.5
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
        self._file_started = 0.0
        self._file_bytes = 0
        self.written = 0
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

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
            if batch:
                await asyncio.to_thread(self._write, batch)

    def close(self) -> None:
        """Write everything still pending and close the file."""
        self._write(self._take())
        if self._file is not None:
            self._file.close()
            self._file = None

    def _take(self) -> list[_Pending]:
        batch, self._pending = self._pending, []
        return batch

    def _write(self, batch: list[_Pending]) -> None:
        if not batch or self.directory is None:
            return
        text = b"".join(self._line(*pending) for pending in batch)
        now = self._clock()
        if self._file is None or self._file_full(now):
            self._open_next(now)
        assert self._file is not None
        self._file.write(text)
        self._file.flush()
        self._file_bytes += len(text)
        self.written += len(batch)

    def _file_full(self, now: float) -> bool:
        return self._file_bytes >= self._max_bytes or now - self._file_started >= self._rotate_s

    def _open_next(self, now: float) -> None:
        if self._file is not None:
            self._file.close()
        assert self.directory is not None
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S%f")
        # Kept open across writes; closed on rotation and by close().
        self._file = open(  # noqa: SIM115
            self.directory / f"events-{self._site}-{stamp}.jsonl", "ab"
        )
        self._file_started = now
        self._file_bytes = 0

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
