"""Uplinks: the links an edge keeps open to the sites that cannot dial it (``msgbusd --uplink TWIN``, and
its link to its relay), dialed again when they break, and what a cloud knows of the uplinks its edges
opened to it: which twins are reached over their uplink only, which is open, since when, and who is told
when one opens or closes (:mod:`msgbusd.link.links` tells the protocol)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from msgbusd.errors import DeliveryError
from msgbusd.link.open_link import Link
from msgbusd.link.way_back import reached_only_over_its_links
from msgbusd.reports.logs import about
from msgbusd.store.leases import first_set
from twin_resolver.base import Twin
from wire.backoff import Backoff, sleep_unless

log = logging.getLogger("msgbusd.links")

# An uplink that broke, or could not be opened, is dialed again after these delays, each anywhere from zero
# up to the backoff: the edges of a cloud site that restarts come back spread over seconds, not as a herd.
UPLINK_REDIAL = Backoff(base_s=0.25, max_s=5.0, full_jitter=True)
# The key of this site's link to its relay among the uplinks' times (twin ids are positive).
RELAY_LINK = 0
# A sender waiting for a twin's uplink looks again this often (it is woken at once when the uplink opens).
UPLINK_WAIT_S = 30.0


class Uplinks:
    """The uplinks of a site, among its links by peer twin (``links``): ``kept``, the twins it keeps an uplink
    to (--uplink), and those that opened one to it in this run (``opened_to_here``)."""

    def __init__(self, kept: Sequence[int], links: Mapping[int, list[Link]]) -> None:
        # The twins this site keeps an uplink to (--uplink), and those that opened one to it in this run:
        # the latter are reached over their uplink only.
        self.kept = tuple(kept)
        self.opened_to_here: set[int] = set()
        # When each uplink last opened or closed (unix time), for msgbus status.
        self.since: dict[int, float] = {}
        # Called with the twin whose uplink to this site just opened.
        self.on_uplink: Callable[[int], None] = _ignore_uplink
        # Told when a twin's uplink to this site opens (True) or its last one closes (False): the site's
        # instance that sends to the twin is the one its uplink is open to.
        self.on_uplink_change: Callable[[int, bool], Awaitable[None]] | None = None
        self._links = links

    def waiting_for(self, twin_id: int) -> None:
        """``twin_id`` is reached over its uplink only and none is open."""
        if twin_id not in self.opened_to_here:
            # Listed among the uplinks (closed, since now) while what waits for it waits.
            self.opened_to_here.add(twin_id)
            self.since[twin_id] = time.time()

    async def opened(self, link: Link, *, link_is_uplink: bool) -> None:
        """``link``, which its twin opened to this site, is that twin's uplink (``link_is_uplink``: the twin
        said so; otherwise it is the twin's way back: it has no address)."""
        peer = link.peer
        self.opened_to_here.add(peer)
        self.since[peer] = time.time()
        kind = "its uplink" if link_is_uplink else "a link (its way back: it has no address)"
        log.info("twin %s opened %s to this site", peer, kind, extra=about(twin=peer))
        await self.retire_older(link)
        await self.tell_change(peer, opened=True)
        self.on_uplink(peer)

    async def ended(self, link: Link) -> None:
        """``link``'s reader ended: when it was the last open uplink its twin opened to this site, that
        uplink is closed since now."""
        if link.uplink and not link.opened_here and self.find(link.peer, opened_here=False) is None:
            self.since[link.peer] = time.time()
            await self.tell_change(link.peer, opened=False)

    async def retire_older(self, newest: Link) -> None:
        """A twin dials its uplink again only once it lost the one before, which may still look open here
        (a NAT gateway that forgot it, a path gone: nothing tells this end): what it carried goes again on
        the new one now, instead of after this end's pings find the old one dead."""
        for older in list(self._links.get(newest.peer, ())):
            if older is not newest and older.uplink and not older.opened_here and older.is_open:
                log.info(
                    "closing the older uplink of twin %s: it opened a new one",
                    newest.peer,
                    extra=about(twin=newest.peer),
                )
                await older.close("the twin opened a new uplink")

    async def keep(
        self,
        name: str,
        key: int,
        dial: Callable[[], Awaitable[Link | None]],
        stopping: asyncio.Event,
        closing: Callable[[], bool],
    ) -> None:
        """Keep the uplink to ``name`` (``key`` among the times) open until ``stopping`` or ``closing()``:
        ``dial`` it, and dial again when it breaks or cannot be opened."""
        failures = 0
        while not stopping.is_set() and not closing():
            try:
                link = await dial()
                cause = f"the site of {name} takes no links"
            except DeliveryError as exc:
                link, cause = None, exc.cause
                if exc.kind == "busy" and exc.retry_after_s is not None:
                    # Turned away by a site letting a herd in: back at the turn it gave, as no failure.
                    log.info("uplink to %s: %s", name, cause)
                    self.since.setdefault(key, time.time())
                    await sleep_unless(stopping, exc.retry_after_s)
                    continue
            except Exception as exc:
                log.exception("opening the uplink to %s failed", name)
                link, cause = None, str(exc)
            if link is not None:
                log.info("uplink to %s is open", name, extra=about(twin=link.peer))
                self.since[key] = time.time()
                failures = 0
                await first_set(link.ended, stopping)
                if stopping.is_set() or closing():
                    return
                cause = f"closed: {link.closed_reason}"
                self.since[key] = time.time()
            elif failures == 0:
                self.since.setdefault(key, time.time())
            failures += 1
            delay_s = UPLINK_REDIAL.delay_s(failures)
            log.warning("uplink to %s: %s; dialing again in %.1fs", name, cause, delay_s)
            await sleep_unless(stopping, delay_s)

    def report(self) -> list[dict[str, Any]]:
        """The uplinks this site keeps ("out") and those opened to it ("in"): open or not, and since when
        (unix time; None: not tried yet)."""
        return [
            {
                "twin": twin_id,
                "direction": "out" if opened_here else "in",
                "open": self.find(twin_id, opened_here=opened_here) is not None,
                "since": self.since.get(twin_id),
            }
            for twin_id, opened_here in [
                *((twin_id, True) for twin_id in self.kept),
                *((twin_id, False) for twin_id in sorted(self.opened_to_here)),
            ]
        ]

    async def tell_change(self, twin_id: int, *, opened: bool) -> None:
        if self.on_uplink_change is None:
            return
        try:
            await self.on_uplink_change(twin_id, opened)
        except Exception as exc:
            # The lease follows at the next change; meanwhile the instance that holds it waits for an uplink.
            log.warning(
                "could not record that the uplink of twin %s %s (%s)",
                twin_id,
                "opened" if opened else "closed",
                exc,
                extra=about(twin=twin_id),
            )

    def find(self, twin_id: int, *, opened_here: bool) -> Link | None:
        for link in self._links.get(twin_id, ()):
            if link.is_open and link.uplink and link.opened_here == opened_here:
                return link
        return None


def by_uplink_only(twin: Twin, *, relays_for_others: bool) -> bool:
    """``twin`` is reached over the link it keeps to this site only: it has no address, or (at a site that
    relays for others) its entry names a relay."""
    if twin.relay:
        return relays_for_others
    return not twin.address.strip()


def waiting_for_link_text(twin_id: int, twin: Twin | None) -> str:
    """Why nothing goes to ``twin_id`` now: it is reached only over a link it opens, and none is open."""
    if twin is not None and reached_only_over_its_links(twin):
        return (
            f"twin {twin_id} has no address: it is reached over a link it opens to this site, "
            "and none is open"
        )
    return f"twin {twin_id} is reached over the uplink it opens to this site, and none is open"


def _ignore_uplink(twin_id: int) -> None:
    pass
