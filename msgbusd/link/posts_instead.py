"""The twins and sites sent POSTs instead of a link, for now (:mod:`msgbusd.link.links` opens the links):
every twin at a site that answers the upgrade with plain HTTP (go-rmb), a twin whose site lets no more
links begin now, until the time it gave, and a twin whose links keep breaking."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from msgbusd.reports.logs import about

log = logging.getLogger("msgbusd.links")

# A site that answers the upgrade with plain HTTP is sent POSTs this long before it is asked again, for every
# twin at its address (scheme, host and port): a daemon answering for many twins is asked once, not per twin.
RECHECK_S = 600.0
# A link opened here that breaks this many times within the window (a proxy or network that cuts long-lived
# connections, or loses much of what it carries) is given up for POSTs a while: each POST stands alone, while
# a link needs its handshake and every ack through.
FLAPPING_BREAKS = 3
FLAPPING_WINDOW_S = 60.0
FLAPPING_POSTS_S = 60.0


class PostsInstead:
    """Which twins (by twin id) and sites (by origin: scheme, host and port) are sent POSTs now, and which
    sites are known to take links or are being asked whether they do."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Twins sent POSTs until then (their links keep breaking), and sites (by origin) that take no links.
        self._posts_until: dict[int, float] = {}
        self._no_links_until: dict[str, float] = {}
        # Sites known to take links, and sites being asked for the first time (meanwhile their other twins
        # are sent POSTs rather than asked too).
        self.takes_links: set[str] = set()
        self.asking: set[str] = set()
        self._breaks: dict[int, deque[float]] = {}

    def for_twin(self, twin_id: int) -> bool:
        """``twin_id`` is sent POSTs now (its links kept breaking, or its site let no more begin)."""
        return self._posts_until.get(twin_id, 0.0) > self._clock()

    def for_site(self, origin: str) -> bool:
        """The site at ``origin`` answered the upgrade with plain HTTP a while ago: not asked again yet."""
        return self._no_links_until.get(origin, 0.0) > self._clock()

    def takes_no_links(self, origin: str) -> None:
        """The site at ``origin`` answered the upgrade with plain HTTP: POSTs for :data:`RECHECK_S`."""
        self._no_links_until[origin] = self._clock() + RECHECK_S

    def until_its_word(self, twin_id: int, retry_after_s: float) -> None:
        """The site of ``twin_id`` lets no more links begin now: POSTs meanwhile, a link again at its word."""
        self._posts_until[twin_id] = self._clock() + retry_after_s

    def broke(self, twin_id: int, reason: str) -> None:
        """A link to ``twin_id`` broke (or was cut while opening): one that broke :data:`FLAPPING_BREAKS`
        times within :data:`FLAPPING_WINDOW_S` gives way to POSTs for :data:`FLAPPING_POSTS_S`."""
        now = self._clock()
        breaks = self._breaks.setdefault(twin_id, deque(maxlen=FLAPPING_BREAKS))
        breaks.append(now)
        if len(breaks) == FLAPPING_BREAKS and now - breaks[0] <= FLAPPING_WINDOW_S:
            span_s = now - breaks[0]
            breaks.clear()
            self._posts_until[twin_id] = now + FLAPPING_POSTS_S
            log.warning(
                "the link to twin %s broke %d times in %.0fs (last: %s); sending it POSTs for %.0fs",
                twin_id,
                FLAPPING_BREAKS,
                span_s,
                reason,
                FLAPPING_POSTS_S,
                extra=about(twin=twin_id),
            )
