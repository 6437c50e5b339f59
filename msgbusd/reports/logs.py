"""Logging for msgbusd: JSON lines for the journal and log shippers, plain lines on a terminal.

A JSON line has ``ts`` (ISO 8601, UTC, microseconds), ``level``, ``logger`` and ``msg``, then whichever of
:data:`CONTEXT_FIELDS` the call passed with ``extra=`` and ``exc`` (the traceback) when there is one::

    log.warning("twin %s refused the message", 9, extra=about(uid=uid, dst=9, cmd="calc.add"))

``src`` and ``dst`` are the twins a message comes from and goes to, ``queue`` the Redis list it was taken
from or handed to, ``twin`` a peer a line is about when it is not about one message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("uid", "cmd", "queue", "src", "dst", "twin")
# Libraries that log every request or connection at INFO/DEBUG; msgbusd logs what matters itself.
NOISY_LOGGERS = ("httpx", "httpcore", "redis", "asyncio", "uvicorn")


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


class _Handler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs; its type is how a second call finds it."""


def configure_logging(level: int, *, json_format: bool | None = None, stream: TextIO | None = None) -> None:
    """Send every log record of at least ``level`` to ``stream`` (default: the current ``sys.stderr``).

    ``json_format=None`` picks JSON lines unless ``stream`` is a terminal. Calling it again replaces the
    handler installed by the previous call; handlers installed by others are left alone.
    """
    target = sys.stderr if stream is None else stream
    if json_format is None:
        json_format = not _is_terminal(target)
    handler = _Handler(target)
    handler.setFormatter(JsonFormatter() if json_format else logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
