"""How a peer's messages go on the wire: stamped, signed (and, through a relay, encrypted for the twin), then
over the link to a msgbus site (:mod:`msgbusd.link.links`) or in POSTs to a site that takes no links (go-rmb,
or ``--no-links``; :mod:`msgbusd.sending.posts`).

A link pays for its handshake only if more follows: a twin sent several messages at once, or one again
within :data:`BUSY_WITHIN_S`, gets one (when its site takes links); a single message now and then goes in a
POST whose connection is not kept. A site that refuses messages as too old while its clock is off from
this one's gets them again over a link, on whose handshake each site measures the other's clock. A site
that other sites answer only over the links it opens (:mod:`msgbusd.link.way_back`) refuses its requests to
a site that takes no links at once, since their answers could not come back; its replies still go, in POSTs.
Each attempt goes to the event log.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from msgbusd.errors import DeliveryError
from msgbusd.identity.sealing import SealError
from msgbusd.link.links import Links
from msgbusd.link.open_link import Link, send_envelopes
from msgbusd.link.way_back import no_way_back
from msgbusd.sending.batch_window import BatchWindow
from msgbusd.sending.send_items import SendItem
from msgbusd.sending.senders import Senders

# A twin sent several messages at once (Peers.link_after), or one again within this long, is worth a link
# (when its site takes links); a single message now and then goes in a POST.
BUSY_WITHIN_S = 10.0


class Transmitter:
    """How one peer's messages reach it: over its link, else in POSTs; one result per message."""

    __slots__ = ("_peers", "_sent_at", "_twin", "_window")

    def __init__(self, twin: int, peers: Senders, window: BatchWindow) -> None:
        self._twin = twin
        self._peers = peers
        # The peer's batches on their way: told which link the batch being written goes on.
        self._window = window
        # When something was last sent to the twin (monotonic).
        self._sent_at = -math.inf

    async def send(
        self, items: list[SendItem], written: asyncio.Event | None = None, link: Link | None = None
    ) -> list[DeliveryError | None]:
        """Stamp, sign and send ``items`` over the link, else in POSTs; one result per item (None: the peer
        has it). Each attempt goes to the event log."""
        peers = self._peers
        started_at, started = peers.clock(), time.perf_counter()
        replies_only = not any(item.is_request for item in items)
        results = await self._transmit(items, replies_only=replies_only, written=written, on=link)
        duration_us = int((time.perf_counter() - started) * 1_000_000)
        for item, error in zip(items, results, strict=True):
            if error is not None and not error.attempted:
                continue
            if error is not None:
                peers.metrics.error(error.kind)
            peers.record_attempt(item, error, started_at, duration_us)
        return results

    async def _transmit(
        self,
        items: list[SendItem],
        *,
        replies_only: bool,
        written: asyncio.Event | None = None,
        on: Link | None = None,
    ) -> list[DeliveryError | None]:
        links = self._peers.links
        link = on
        now = time.monotonic()
        # One message now and then goes in a POST whose connection is not kept.
        lone = len(items) == 1 and now - self._sent_at >= BUSY_WITHIN_S
        # A link pays for its handshake only if more follows.
        busy = len(items) >= self._peers.link_after or now - self._sent_at < BUSY_WITHIN_S
        self._sent_at = now
        if links is not None and link is None:
            try:
                link = await links.link_to(self._twin, replies_only=replies_only, open_new=busy)
            except DeliveryError as exc:
                return [exc] * len(items)
        if written is not None:
            self._window.link = link
        if link is None and not replies_only and await self._answered_only_over_links():
            return await self._without_way_back(items, lone=lone)
        # Through a relay (a link to another twin, or POSTs to the twin's relay), payloads are encrypted for
        # the twin.
        seal_for = None
        if link is None or link.peer != self._twin:
            seal_for = await self._peers.relayed_twin(self._twin)
        try:
            signed = [(item.path, self._peers.sign(item, seal_for)) for item in items]
        except SealError as exc:
            # Nothing can go to the twin through its relay until its twin entry says how to encrypt for it.
            return [DeliveryError(str(exc), kind="refused", final=True)] * len(items)
        if link is not None:
            started = time.perf_counter()
            results = await send_envelopes(link, signed, self._peers.links_timeout_s, written)
            self._peers.metrics.observe_send("link", time.perf_counter() - started)
            if links is not None and not replies_only and link.peer == self._twin:
                links.expect_answers(self._twin, _answers_within_s(items))
            return results
        results = await self._peers.posts.send_many(self._twin, signed, keep_alive=not lone)
        if links is not None and any(result is not None and result.clock_off for result in results):
            results = await self._again_over_a_link(links, items, results, replies_only=replies_only)
        return results

    async def _again_over_a_link(
        self, links: Links, items: list[SendItem], results: list[DeliveryError | None], *, replies_only: bool
    ) -> list[DeliveryError | None]:
        """The twin's site refused messages as too old, and its clock is off from this site's: they go again
        over a link, on whose handshake each site measures the other's clock and judges the messages of
        the other on it. A site that takes no links keeps the refusals (go-rmb's rule stands)."""
        try:
            link = await links.link_to(self._twin, replies_only=replies_only, open_new=True)
        except DeliveryError:
            return results
        if link is None or link.peer != self._twin:
            return results
        again = [index for index, result in enumerate(results) if result is not None and result.clock_off]
        signed = [(items[index].path, self._peers.sign(items[index], None)) for index in again]
        sent = await send_envelopes(link, signed, self._peers.links_timeout_s)
        if not replies_only:
            links.expect_answers(self._twin, _answers_within_s([items[index] for index in again]))
        merged = list(results)
        for index, result in zip(again, sent, strict=True):
            merged[index] = result
        return merged

    async def _answered_only_over_links(self) -> bool:
        way_back = self._peers.way_back
        return way_back is not None and await way_back.only_over_links()

    async def _without_way_back(self, items: list[SendItem], *, lone: bool) -> list[DeliveryError | None]:
        """This site is answered only over its links, and the twin's site takes none: its requests are
        refused at once (their answers could not come back); replies still go, in POSTs."""
        way_back = self._peers.way_back
        assert way_back is not None
        refusal = no_way_back(way_back.twin, self._twin, links_off=self._peers.links is None)
        results: list[DeliveryError | None] = [refusal if item.is_request else None for item in items]
        replies = [item for item in items if not item.is_request]
        if replies:
            seal_for = await self._peers.relayed_twin(self._twin)
            try:
                signed = [(item.path, self._peers.sign(item, seal_for)) for item in replies]
            except SealError as exc:
                signed, sealing = [], DeliveryError(str(exc), kind="refused", final=True)
                results = [sealing if result is None else result for result in results]
            if signed:
                sent = iter(await self._peers.posts.send_many(self._twin, signed, keep_alive=not lone))
                results = [next(sent) if result is None else result for result in results]
        return results


def _answers_within_s(items: Sequence[SendItem]) -> float:
    """How long answers to the requests among ``items`` may still come (their lifetimes)."""
    return max((float(item.envelope.lifetime_s) for item in items if item.is_request), default=0.0)
