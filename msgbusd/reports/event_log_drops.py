"""What the event log drops when it cannot write, and how it says so.

The event log is the only file msgbusd writes, and it is never worth stopping the bus for: an event that
cannot be written (a full disk, a file system gone read-only, permissions, an I/O error, the directory
removed, or events coming faster than they can be written) is dropped, as journald drops what it cannot
store. Each drop is counted by reason (``msgbus_event_log_dropped_total{reason}``); the daemon's log says
so in one warning at most every :data:`WARN_EVERY_S`, naming the directory, the error and how many were
dropped since the last warning; and while writing fails, ``/status`` (and so ``msgbus status``) shows a
warning, gone at the first event written again.

Everything here is called on the event loop (never from the writer's thread), so it needs no lock.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from msgbusd.reports.metrics import EventLogDrop, Metrics

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0

_REASONS: dict[int, EventLogDrop] = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EROFS: "read_only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.ENOENT: "missing",
    errno.ENOTDIR: "not_a_directory",
    errno.EISDIR: "not_a_directory",
    errno.EIO: "io_error",
}


def drop_reason(exc: OSError) -> EventLogDrop:
    """The metric's ``reason`` for a write that failed with ``exc``."""
    return _REASONS.get(exc.errno or 0, "other")


def describe(exc: OSError) -> str:
    """``exc`` in a few words, without the path (the warnings name the directory)."""
    return exc.strerror or str(exc) or type(exc).__name__


@dataclass
class _Outage:
    error: str
    since: float
    dropped: int = 0


class Drops:
    """The drops of the event log in ``directory``: counted, logged at most once a minute, shown while
    writing fails."""

    def __init__(
        self, directory: Path, *, clock: Callable[[], float] = time.time, metrics: Metrics | None = None
    ) -> None:
        self.directory = directory
        self.by_reason: Counter[EventLogDrop] = Counter()
        self._clock = clock
        self._metrics = metrics
        self._outage: _Outage | None = None
        # What the next warning tells: the events dropped since the last one, from when, and the last error.
        self._unreported = 0
        self._unreported_since = 0.0
        self._last_error = ""
        self._warned_at: float | None = None
        # An outage began that no warning named yet (one may begin without a drop: at start).
        self._news = False
        self._written_again = False

    def failed(self, exc: OSError, count: int) -> None:
        """A write failed with ``exc``; its ``count`` events are dropped."""
        self.dropped(drop_reason(exc), describe(exc), count)

    def dropped(self, reason: EventLogDrop, error: str, count: int) -> None:
        """``count`` events are dropped (possibly none, when writing is found impossible before any came).
        :meth:`report` says so."""
        now = self._clock()
        if self._outage is None:
            self._outage = _Outage(error, now)
            self._news = True
        self._outage.error = self._last_error = error
        if count:
            self._outage.dropped += count
            self.by_reason[reason] += count
            if self._metrics is not None:
                self._metrics.event_log_drop(reason, count)
            if not self._unreported:
                self._unreported_since = now
            self._unreported += count

    def written(self) -> None:
        """Events were written: an outage, if any, is over."""
        if self._outage is not None:
            self._outage = None
            self._written_again = True

    def report(self, *, final: bool = False) -> None:
        """Log what no warning said yet, unless a warning was logged less than :data:`WARN_EVERY_S` ago
        (``final``: the log closes, say it now)."""
        now = self._clock()
        due = final or self._warned_at is None or now - self._warned_at >= WARN_EVERY_S
        if (self._unreported or self._news) and due:
            since = self._unreported_since if self._unreported else now
            if self._outage is not None:
                log.warning(
                    "the event log in %s cannot be written (%s): %s event(s) dropped since %s; messages "
                    "are carried as usual; it writes again once it can",
                    self.directory,
                    self._last_error,
                    f"{self._unreported:,}",
                    clock_time(since),
                )
            else:
                log.warning(
                    "the event log in %s could not be written (%s): %s event(s) dropped since %s; it is "
                    "written again",
                    self.directory,
                    self._last_error,
                    f"{self._unreported:,}",
                    clock_time(since),
                )
            self._warned_at = now
            self._unreported = 0
            self._news = self._written_again = False
        elif self._written_again and not self._unreported:
            log.info("the event log in %s is written again", self.directory)
            self._written_again = False

    def warnings(self) -> list[str]:
        """The ``/status`` warning while writing fails (none otherwise), for :class:`SiteWarnings`."""
        outage = self._outage
        if outage is None:
            return []
        return [
            f"the event log in {self.directory} cannot be written ({outage.error}): {outage.dropped:,} "
            f"event(s) dropped since {clock_time(outage.since)}; messages are carried as usual; it writes "
            "again once it can"
        ]


def clock_time(at: float) -> str:
    """``at`` as the local time of day, as ``msgbus status`` shows times."""
    return time.strftime("%H:%M:%S", time.localtime(at))
