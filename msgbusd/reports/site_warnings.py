"""What a site warns of: conditions that do not stop the bus but that its operator should act on (a log it
cannot write, a peer whose clock is off, a Redis that may evict queued messages).

``/status`` lists them and ``msgbus status`` shows the site as degraded with each one; ``/healthz`` does not
fail for them, so that nothing restarts a daemon that carries messages well because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

WarningSource = Callable[[], Iterable[str]]


class SiteWarnings:
    """The sources of a site's warnings, each asked afresh for every report."""

    def __init__(self) -> None:
        self._sources: list[WarningSource] = []

    def add(self, source: WarningSource) -> None:
        """Ask ``source`` for its warnings (plain sentences, none when all is well) in every report."""
        self._sources.append(source)

    def current(self) -> list[str]:
        """Every source's warnings, in the order the sources were added. A source that fails is named
        rather than failing the report."""
        warnings: list[str] = []
        for source in self._sources:
            try:
                warnings.extend(source())
            except Exception as exc:  # a report of problems must not become one
                log.exception("a warning source failed")
                warnings.append(f"a warning could not be worked out: {exc}")
        return warnings
