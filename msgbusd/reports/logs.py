"""Logging for msgbusd: JSON lines for the journal and log shippers, plain lines on a terminal.

A JSON line has ``ts`` (ISO 8601, UTC, microseconds), ``level``, ``logger`` and ``msg``, then whichever of
:data:`CONTEXT_FIELDS` the call passed with ``extra=`` and ``exc`` (the traceback) when there is one::

    log.warning("twin %s refused the message", 9, extra=about(uid=uid, dst=9, cmd="calc.add"))

``src`` and ``dst`` are the twins a message comes from and goes to, ``queue`` the Redis list it was taken
from or handed to, ``twin`` a peer a line is about when it is not about one message.

The lines are written by a thread of their own: a log call only queues its record, so a stream that takes
its time (journald catching up, a pipe nobody reads fast enough) never stops the daemon's event loop. Beyond
:data:`QUEUED_RECORDS` waiting, records are dropped and counted, and the writer says how many once it can.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import logging.handlers
import queue
import sys
import threading
from datetime import UTC, datetime
from typing import TextIO

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("uid", "cmd", "queue", "src", "dst", "twin")
# Libraries that log every request or connection at INFO/DEBUG; msgbusd logs what matters itself.
NOISY_LOGGERS = ("httpx", "httpcore", "redis", "asyncio", "uvicorn")
# Records waiting for the writer, at most (a few MB); more are dropped and counted.
QUEUED_RECORDS = 10_000


def about(
    *,
    uid: str | None = None,
    cmd: str | None = None,
    queue: str | None = None,
    src: int | None = None,
    dst: int | None = None,
    twin: int | None = None,
) -> dict[str, object]:
    """The ``extra=`` of a log call about one message (or one peer): the fields a JSON line carries."""
    given = {"uid": uid, "cmd": cmd, "queue": queue, "src": src, "dst": dst, "twin": twin}
    return {name: value for name, value in given.items() if value is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class _Handler(logging.handlers.QueueHandler):
    """The handler :func:`configure_logging` installs (its type is how a second call finds it): it queues
    each record for a thread that writes it to ``target``."""

    def __init__(self, target: logging.Handler, queued_records: int) -> None:
        self._records: queue.Queue[logging.LogRecord] = queue.Queue(queued_records)
        super().__init__(self._records)
        self._lock = threading.Lock()
        self._dropped = 0
        self._closed = False
        self._listener = _Writer(self, target)
        self._listener.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record as the writer gets it: its message made now (its arguments may change later) and its
        traceback as text; its extra fields kept."""
        prepared = copy.copy(record)
        prepared.msg = record.getMessage()
        prepared.args = None
        if record.exc_info:
            prepared.exc_text = logging.Formatter().formatException(record.exc_info)
            prepared.exc_info = None
        return prepared

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self._records.put_nowait(record)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def caught_up(self) -> bool:
        """Nothing waits to be written."""
        return self._records.empty()

    def take_dropped(self) -> int:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        return dropped

    def flush(self) -> None:
        """Return once every record queued so far is written."""
        self._records.join()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._listener.stop()
        super().close()


class _Writer(logging.handlers.QueueListener):
    """The thread that writes the queued records, and once it caught up how many were dropped meanwhile."""

    def __init__(self, queued: _Handler, target: logging.Handler) -> None:
        super().__init__(queued.queue, target)
        self._queued = queued
        self._target = target

    def handle(self, record: logging.LogRecord) -> None:
        super().handle(record)
        dropped = self._queued.take_dropped() if self._queued.caught_up() else 0
        if dropped:
            self._target.handle(
                logging.makeLogRecord(
                    {
                        "name": "msgbusd.logs",
                        "levelno": logging.WARNING,
                        "levelname": "WARNING",
                        "msg": f"{dropped} log line(s) dropped: the log stream did not take them fast enough",
                    }
                )
            )


def configure_logging(
    level: int,
    *,
    json_format: bool | None = None,
    stream: TextIO | None = None,
    queued_records: int = QUEUED_RECORDS,
) -> None:
    """Send every log record of at least ``level`` to ``stream`` (default: the current ``sys.stderr``), by a
    thread of its own (at most ``queued_records`` waiting).

    ``json_format=None`` picks JSON lines unless ``stream`` is a terminal. Calling it again replaces the
    handler installed by the previous call; handlers installed by others are left alone. What is queued
    when the process exits is written first.
    """
    target = sys.stderr if stream is None else stream
    if json_format is None:
        json_format = not _is_terminal(target)
    writer = logging.StreamHandler(target)
    writer.setFormatter(JsonFormatter() if json_format else logging.Formatter(PLAIN_FORMAT))
    handler = _Handler(writer, queued_records)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    atexit.register(handler.close)
    root.setLevel(level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def flush_logs() -> None:
    """Return once every record logged so far has been written (the handler of :func:`configure_logging`)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _Handler):
            handler.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
