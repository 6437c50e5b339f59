"""Links: one long-lived WebSocket between two msgbus sites, carrying envelopes both ways.

A site that has something to send to a peer opens a link to ``/zbus-link`` on the peer's site port (an
HTTP upgrade, so the same port and the same proxies). Once both ends know who is at the other end, each
side sends on it: the requests one way and their replies the other way. A peer that answers the upgrade
with plain HTTP (go-rmb) is sent POSTs instead (:mod:`msgbusd.sending.posts`).

Every frame is one JSON object in a binary WebSocket message::

    site -> opener   {"op": "challenge", "twin": S, "nonce": "<hex>", "max_bytes": N, "parts": true}
    opener -> site   {"op": "hello", "twin": C, "nonce": "<hex>", "sig": "<hex>", "max_bytes": N,
                      "parts": true, "time": T, "time_sig": "<hex>"}
    site -> opener   {"op": "welcome", "sig": "<hex>", "time": T, "time_sig": "<hex>"}
    either way       {"op": "send", "id": N, "messages": [{"path": "/zbus-remote", "envelope": {...}}, ...]}
    either way       {"op": "ack", "id": N, "results": [{"status": 200}, {"status": 400, "message": "..."}]}

or, when it is larger than 16 KiB and the other end said ``"parts": true`` in its handshake frame, in parts
(:mod:`msgbusd.link.link_parts`): binary messages that start with a 0x00 byte (a JSON frame never does),
then flags (first, last) and a part id of the writer's own, then the frame's next slice. The reader puts the
frame together and takes it as if it came whole. Each end has one writer (:mod:`msgbusd.link.link_writer`):
the small frames, acks among them, go before the next part of a large one instead of waiting seconds behind
it on a thin cable, parts are about 50 ms of the cable's rate, and little waits in the buffers below it
(:mod:`msgbusd.link.link_pacing`). A site that does not say ``"parts"`` (an older one: it ignores the key
in the other's frame) is written whole frames, as before.

An opener that keeps the link up so that the site can reach it (``msgbusd --uplink TWIN``: an edge that
cannot be dialed) says so in its hello (``"uplink": true``): the site then sends everything for that twin
over it, requests too, and keeps what waits for the twin in its send queue while no uplink is open.

``hello`` is signed by the opener's twin key over (C, S, the site's nonce) and ``welcome`` by the site's
over (S, C, the opener's nonce), both checked against the resolver: nobody can open a link in another
twin's name and collect its replies, nor pose as the twin we meant to reach. ``time`` is the clock of
the side that sends ``hello`` or ``welcome``, signed over the other side's nonce: each side learns how far
the other's clock is from its own (:mod:`msgbusd.link.peer_clocks`). A refused handshake closes
the link with code 4403 and the reason. ``max_bytes`` is the largest envelope each side takes: larger
ones are refused (413) without being sent, and a frame holds at most that much.

Every envelope is still signed and checked on its own and answered on its own in the ``ack`` (go-rmb's
status and text), and the sender pops its queue only after the ack: a link that breaks loses nothing, its
frames without an ack are sent again on the next link, and the receiver drops what it already has. An ack
is waited for from when the frame's last piece was written (a large frame on a slow cable is not cut for
taking long).

Whether a link's connection is alive the kernels at its ends find out (:mod:`msgbusd.link.link_keepalive`:
the opener's within about twice ``ping_s``), however busy either site is. The opener also pings a link that
carried nothing for :data:`PING_EVERY_S` (or ``ping_s``, when longer), so that a proxy between the sites does
not close it for being idle, and closes it when that ping's pong does not come within as long again (unless
the opener itself was late: a busy site is not taken for a dead one). The other end sends no pings. The
site's end lets links begin at a bounded rate (:mod:`msgbusd.link.link_admission`): an opener turned away
dials again when it was told to.

The parts of a site's links each read on their own: one open link (:mod:`msgbusd.link.open_link`), the
handshake (:mod:`msgbusd.link.handshake`), the uplinks (:mod:`msgbusd.link.uplinks`), and the twins and sites
sent POSTs instead for now (:mod:`msgbusd.link.posts_instead`). :class:`Links` keeps them together.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from msgbusd.errors import DeliveryError
from msgbusd.identity.signing import Signer
from msgbusd.link.handshake import Handshakes, LinkUnsupported
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_sockets import Socket
from msgbusd.link.open_link import Answer, Link
from msgbusd.link.peer_clocks import PeerClocks
from msgbusd.link.posts_instead import PostsInstead
from msgbusd.link.site_socket import LINK_PATH
from msgbusd.link.uplinks import RELAY_LINK, UPLINK_WAIT_S, Uplinks, by_uplink_only, waiting_for_link_text
from msgbusd.link.way_back import WayBack, reached_only_over_its_links
from msgbusd.reports.logs import about
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError, Twin
from wire.backoff import sleep_unless

log = logging.getLogger("msgbusd.links")

# Idle links are looked for this often at most.
IDLE_CHECK_S = 10.0
# A link this site opened that carried nothing for this long (or --link-ping, when longer) is pinged: a
# proxy between the sites closes a tunnel idle for its timeout (often 30 or 60 s).
PING_EVERY_S = 25.0
# The links this site opened are looked at this often for their pings.
PING_SWEEP_S = 1.0
# A sweep of the pings that begins this much later than it was due finds this site itself late: it closes no
# link for a pong that may be waiting, unread, behind what made it late.
LATE_S = 0.5


class Links:
    """This site's links, by peer twin: the ones it opened and the ones peers opened to it.

    ``link_to`` gives the open link to a twin, opening one if needed; None when the twin's site does not
    take links (it is sent POSTs). ``serve`` is the site port's ``/zbus-link`` endpoint.
    """

    def __init__(
        self,
        twin: int,
        signer: Signer,
        resolver: Resolver,
        http: HttpClients,
        answer: Answer,
        *,
        timeout_s: float,
        ping_s: float = 5.0,
        max_frame_bytes: int,
        idle_s: float = 300.0,
        max_links: int = 4096,
        uplinks: Sequence[int] = (),
        relay: str = "",
        relays_for_others: bool = False,
        way_back: WayBack | None = None,
        clock: Callable[[], float] = time.monotonic,
        clocks: PeerClocks | None = None,
        on_new_link: Callable[[], None] | None = None,
    ) -> None:
        self._twin = twin
        # Called for each link that opens (the daemon sets a herd of them aside from the cyclic collector as
        # it comes).
        self._on_new_link = on_new_link or _nothing
        # The peers' clocks (``clocks``) are measured at each handshake.
        self._handshakes = Handshakes(
            twin,
            signer,
            resolver,
            http,
            clocks or PeerClocks(),
            max_frame_bytes=max_frame_bytes,
            timeout_s=timeout_s,
            ping_s=ping_s,
        )
        # Whether other sites can answer this one only over links it opens (no address, no relay).
        self._way_back = way_back or WayBack(twin, resolver)
        # A site answered only over links keeps the link to a twin open until then (monotonic): answers to
        # the requests sent over it may still come.
        self._answers_until: dict[int, float] = {}
        # The relay this site's own twin entry names (host:port): this site keeps a link to it, over which
        # the relay sends it everything for its twin.
        self.relay = relay
        # --relay: the twins whose entries name a relay are reached over the links they keep to this site.
        self.relays_for_others = relays_for_others
        # Relays dialed, by origin: the twin at the other end.
        self._relay_twins: dict[str, int] = {}
        self.idle_s = idle_s
        self.max_links = max_links
        self._resolver = resolver
        self._answer = answer
        self.timeout_s = timeout_s
        self._ping_s = ping_s
        self.max_frame_bytes = max_frame_bytes
        self._clock = clock
        self._links: dict[int, list[Link]] = {}
        # The uplinks this site keeps (--uplink: ``uplinks``) and those its edges opened to it, and who is
        # told when one of the latter opens or closes (``on_uplink``, ``on_uplink_change``).
        self.uplink_record = Uplinks(uplinks, self._links)
        self.uplinks = self.uplink_record.kept
        self._opening: dict[int, asyncio.Lock] = {}
        self._opening_relays: dict[str, asyncio.Lock] = {}
        # The twins and sites sent POSTs for now, and the sites known to take links.
        self._posts = PostsInstead(clock)
        self._readers: set[asyncio.Task[None]] = set()
        self._closing = False
        # Links adopted whose reader has not ended yet that this site may close to make room (uplinks it
        # may not: an edge is reached over its uplink only), and those it opened itself (it pings them).
        self._closable: set[Link] = set()
        self._dialed: set[Link] = set()

    @property
    def clocks(self) -> PeerClocks:
        """The peers' clocks, measured at each handshake (which is stamped with this site's)."""
        return self._handshakes.clocks

    @clocks.setter
    def clocks(self, clocks: PeerClocks) -> None:
        self._handshakes.clocks = clocks

    def open_count(self) -> int:
        return sum(1 for links in self._links.values() for link in links if link.is_open)

    async def close_idle(self) -> int:
        """Close the links that carried nothing for ``idle_s`` (either end's: the peer opens one again
        when it has work); returns how many."""
        now = self._clock()
        # The uplinks (all of a cloud's ten thousand links) are never closed for being idle: not looked at.
        idle = [
            link
            for link in self._closable
            if link.is_open
            and not link.busy
            and now - link.used_at >= self.idle_s
            and self._answers_until.get(link.peer, 0.0) <= now
        ]
        for link in idle:
            log.info("closing the link with twin %s: idle", link.peer, extra=about(twin=link.peer))
            await link.retire(f"idle for {self.idle_s:g}s")
        return len(idle)

    async def close_idle_until(self, stopping: asyncio.Event) -> None:
        """Close idle links every little while until ``stopping``."""
        while not stopping.is_set():
            await sleep_unless(stopping, min(self.idle_s / 2, IDLE_CHECK_S))
            if stopping.is_set():
                return
            try:
                await self.close_idle()
            except Exception:
                log.exception("closing idle links failed")

    async def ping_until(self, stopping: asyncio.Event) -> None:
        """Ping the links this site opened while they carry nothing (:meth:`ping_due`) until ``stopping``."""
        due = self._clock() + PING_SWEEP_S
        while not stopping.is_set():
            await sleep_unless(stopping, max(0.0, due - self._clock()))
            if stopping.is_set():
                return
            now = self._clock()
            late = now - due > LATE_S
            due = now + PING_SWEEP_S
            try:
                await self.ping_due(now, late=late)
            except Exception:
                log.exception("pinging links failed")

    async def ping_due(self, now: float, *, late: bool = False) -> None:
        """Ping each link this site opened that carried nothing for :data:`PING_EVERY_S` (``ping_s`` when
        longer), and close those whose pong is as late, unless this site itself is ``late``."""
        every_s = max(self._ping_s, PING_EVERY_S)
        for link in list(self._dialed):
            await link.keep_alive(now, every_s, may_close=not late)

    async def link_to(
        self, twin_id: int, *, replies_only: bool = False, open_new: bool = True
    ) -> Link | None:
        """The link to send to ``twin_id`` on, opened now if there is none (and ``open_new``); None if its
        site takes POSTs only, or there is none and none is to be opened. Raises :class:`DeliveryError`
        when the site cannot be reached or fails the handshake.

        Requests go over a link this site opened, to the address the resolver gives for the twin. Replies
        go back over the link the twin opened (the one their requests came on) while it is open."""
        link = self._current(twin_id, replies_only)
        if link is not None:
            return link
        twin = await self._known_twin(twin_id)
        if twin_id in self.uplink_record.opened_to_here or (
            twin is not None and by_uplink_only(twin, relays_for_others=self.relays_for_others)
        ):
            self.uplink_record.waiting_for(twin_id)
            raise DeliveryError(
                waiting_for_link_text(twin_id, twin),
                kind="unreachable",
                retry_after_s=UPLINK_WAIT_S,
                attempted=False,
                waits_for_uplink=True,
            )
        if twin is not None and twin.relay:
            return await self.link_to_relay(twin.relay, open_new=open_new)
        # An uplink is kept as a link whatever happened to the ones before, and so is every link of a site
        # that is answered only over its links.
        keeps_link = twin_id in self.uplinks or await self._way_back.only_over_links()
        if not (open_new or keeps_link) or (not keeps_link and self._posts.for_twin(twin_id)):
            return None
        lock = self._opening.setdefault(twin_id, asyncio.Lock())
        async with lock:
            link = self._current(twin_id, replies_only)
            if link is not None:
                return link
            if not keeps_link and self._posts.for_twin(twin_id):
                return None
            twin, url = await self._link_url(twin_id)
            origin = _origin(url)
            if self._posts.for_site(origin):
                return None
            first_ask = origin not in self._posts.takes_links
            if first_ask:
                if origin in self._posts.asking:
                    return None
                self._posts.asking.add(origin)
            # A link to the site of this site's own relay is the link to its relay, however it is opened.
            to_relay = self._is_own_relay(origin)
            try:
                uplink = twin_id in self.uplinks or to_relay
                link = await self._open(twin_id, url, twin.public_key, uplink=uplink, to_relay=to_relay)
            except LinkUnsupported as exc:
                self._posts.takes_links.discard(origin)
                self._posts.takes_no_links(origin)
                log.info(
                    "twin %s takes POSTs only (%s); so do the other twins at %s",
                    twin_id,
                    exc,
                    origin,
                    extra=about(twin=twin_id),
                )
                return None
            except DeliveryError as exc:
                if exc.kind == "busy" and not keeps_link and exc.retry_after_s is not None:
                    # The site lets no more links begin now: POSTs meanwhile, a link again at its word.
                    self._posts.until_its_word(twin_id, exc.retry_after_s)
                    log.info("%s; sending it POSTs meanwhile", exc.cause, extra=about(twin=twin_id))
                    return None
                if exc.offline:
                    await self._broke(twin_id, exc.cause)
                raise
            finally:
                if first_ask:
                    self._posts.asking.discard(origin)
            self._posts.takes_links.add(origin)
            if to_relay:
                self._relay_twins[origin] = link.peer
            await self._start_reading(link)
            return link

    async def serve(self, socket: Socket) -> None:
        """``/zbus-link``: a peer opened a link to this site (its upgrade was taken; the handshake is
        next)."""
        greeted = await self._handshakes.greet_in_time(socket)
        if greeted is None:
            return
        peer, peer_max_bytes, uplink, reads_parts = greeted
        if self._closing:
            await socket.close(1001, "the site is stopping")
            return
        # A twin that has neither an address nor a relay is answered over whichever link it opens: this end
        # keeps it as that twin's uplink (sends it everything, never closes it for being idle).
        link_is_uplink = uplink
        uplink = uplink or await self._reached_only_by_its_links(peer)
        link = Link(
            peer,
            socket,
            self._answer,
            opened_here=False,
            peer_max_bytes=peer_max_bytes,
            peer_reads_parts=reads_parts,
            max_bytes=self.max_frame_bytes,
            uplink=uplink,
            clock=self._clock,
        )
        await self._adopt(link)
        if uplink:
            await self.uplink_record.opened(link, link_is_uplink=link_is_uplink)
        else:
            log.info("twin %s opened a link to this site", peer, extra=about(twin=peer))
        await self._read(link)

    async def reopen_ways_back(
        self, awaited_answers: Callable[[float], Awaitable[Mapping[int, float]]], now: float
    ) -> None:
        """At start-up, a site answered only over its links opens one to every twin whose answers it still
        waits for (``awaited_answers(now)``: twin -> the last deadline, unix time): the links of its last
        run are gone, and the answers wait at those twins' sites for one."""
        if not await self._way_back.only_over_links():
            return
        for twin_id, deadline in sorted((await awaited_answers(now)).items()):
            if twin_id == self._twin or deadline <= now:
                continue
            self.expect_answers(twin_id, deadline - now)
            try:
                await self.link_to(twin_id)
            except DeliveryError as exc:
                # The sender opens it when it sends there again; the answers wait at that site meanwhile.
                log.info(
                    "could not open a link to twin %s for the answers this site waits for: %s",
                    twin_id,
                    exc.cause,
                    extra=about(twin=twin_id),
                )

    @property
    def keeps_links(self) -> bool:
        """This site keeps links open: uplinks (--uplink), or the link to its relay."""
        return bool(self.uplinks or self.relay)

    async def keep_uplinks(self, stopping: asyncio.Event) -> None:
        """Keep a link open to each twin of ``uplinks``, and to this site's relay, until ``stopping``: dial
        it, and dial again when it breaks or cannot be opened."""
        async with asyncio.TaskGroup() as group:
            for twin_id in self.uplinks:
                group.create_task(
                    self.uplink_record.keep(
                        f"twin {twin_id}",
                        twin_id,
                        functools.partial(self.link_to, twin_id),
                        stopping,
                        self._is_closing,
                    ),
                    name=f"uplink to twin {twin_id}",
                )
            if self.relay:
                group.create_task(
                    self.uplink_record.keep(
                        "the relay", RELAY_LINK, self._dial_relay, stopping, self._is_closing
                    ),
                    name="relay link",
                )

    async def _dial_relay(self) -> Link | None:
        # The twin entry may name another relay by now: the link goes where it says.
        own = await self._known_twin(self._twin)
        if own is not None and own.relay:
            self.relay = own.relay
        return await self.link_to_relay(self.relay, uplink=True)

    def _is_closing(self) -> bool:
        return self._closing

    def uplinks_report(self) -> list[dict[str, Any]]:
        """The uplinks this site keeps ("out"), its link to its relay ("relay", with the relay's twin once
        known), and those opened to it ("in"): open or not, and since when (unix time; None: not tried
        yet)."""
        relay: list[dict[str, Any]] = []
        if self.relay:
            origin = _relay_origin(self.relay)
            relay.append(
                {
                    "twin": self._relay_twins.get(origin),
                    "direction": "relay",
                    "relay": self.relay,
                    "open": self._relay_link(origin) is not None,
                    "since": self.uplink_record.since.get(RELAY_LINK),
                }
            )
        return relay + self.uplink_record.report()

    def current_uplink(self, twin_id: int) -> Link | None:
        """The open uplink ``twin_id`` opened to this site, if any."""
        return self.uplink_record.find(twin_id, opened_here=False)

    async def reached_by_uplink(self, twin_id: int) -> bool:
        """``twin_id`` opened an uplink to this site (in this run), or has no address: it is reached over
        its uplink, and nothing is sent to it while none is open."""
        if twin_id in self.uplink_record.opened_to_here:
            return True
        twin = await self._known_twin(twin_id)
        return twin is not None and by_uplink_only(twin, relays_for_others=self.relays_for_others)

    async def _reached_only_by_its_links(self, twin_id: int) -> bool:
        twin = await self._known_twin(twin_id)
        return twin is not None and reached_only_over_its_links(twin)

    def expect_answers(self, twin_id: int, within_s: float) -> None:
        """Requests just went to ``twin_id`` over a link this site opened: when this site is answered only
        over its links, that link is not closed for being idle before ``within_s`` has passed."""
        now = self._clock()
        self._answers_until[twin_id] = max(now + within_s, self._answers_until.get(twin_id, 0.0))
        if len(self._answers_until) > 2 * self.max_links:
            self._answers_until = {t: u for t, u in self._answers_until.items() if u > now}

    async def _known_twin(self, twin_id: int) -> Twin | None:
        try:
            return await self._resolver.get_twin(twin_id)
        except ResolverError:
            return None

    async def link_to_relay(self, relay: str, *, open_new: bool = True, uplink: bool = False) -> Link | None:
        """The link to the relay at ``relay`` (``host:port``), opened now if there is none (and
        ``open_new``); None if the relay takes POSTs only. ``uplink``: the link is this site's own link to
        its relay, kept open for the relay to send this site's messages over it. Raises
        :class:`DeliveryError` when the relay cannot be reached or fails the handshake."""
        try:
            url = peer_url(relay, LINK_PATH)
        except ValueError as exc:
            raise DeliveryError(f"unusable relay address {relay!r}: {exc}") from exc
        origin = _origin(url)
        # Whatever opens the link to this site's own relay, the relay sends this site's messages over it.
        to_relay = self._is_own_relay(origin)
        uplink = uplink or to_relay
        link = self._relay_link(origin)
        if link is not None or not open_new or self._posts.for_site(origin):
            return link
        lock = self._opening_relays.setdefault(origin, asyncio.Lock())
        async with lock:
            link = self._relay_link(origin)
            if link is not None:
                return link
            try:
                link = await self._open(None, url, None, uplink=uplink, to_relay=to_relay)
            except LinkUnsupported as exc:
                self._posts.takes_no_links(origin)
                log.info("the relay at %s takes POSTs only (%s)", origin, exc)
                return None
            self._relay_twins[origin] = link.peer
            await self._start_reading(link)
            return link

    async def _start_reading(self, link: Link) -> None:
        """Count a link this site opened among its links and read it in a task of its own."""
        await self._adopt(link)
        reader = asyncio.ensure_future(self._read(link))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)

    def _is_own_relay(self, origin: str) -> bool:
        return bool(self.relay) and origin == _relay_origin(self.relay)

    def _relay_link(self, origin: str) -> Link | None:
        """The open link this site opened to the relay at ``origin``, if any."""
        relay_twin = self._relay_twins.get(origin)
        if relay_twin is None:
            return None
        opened = [link for link in self._links.get(relay_twin, ()) if link.is_open and link.opened_here]
        return opened[-1] if opened else None

    async def aclose(self) -> None:
        """Close every link (the daemon stops); their readers end."""
        self._closing = True
        for links in list(self._links.values()):
            for link in list(links):
                await link.close("the site is stopping", code=1001)
        if self._readers:
            await asyncio.wait(list(self._readers), timeout=self.timeout_s)

    def current(self, twin_id: int, *, replies_only: bool = False) -> Link | None:
        """The open link :meth:`link_to` sends on now, if any (none is opened)."""
        return self._current(twin_id, replies_only)

    def _current(self, twin_id: int, replies_only: bool) -> Link | None:
        links = [link for link in self._links.get(twin_id, ()) if link.is_open]
        if not links:
            return None
        uplinks = [link for link in links if link.uplink and not link.opened_here]
        if uplinks:
            return uplinks[-1]
        ours = [link for link in links if link.opened_here]
        theirs = [link for link in links if not link.opened_here]
        if replies_only and theirs:
            return theirs[-1]
        return ours[-1] if ours else None

    async def _adopt(self, link: Link) -> None:
        self._on_new_link()
        if not link.uplink:
            if len(self._closable) >= self.max_links:
                await self._make_room()
            self._closable.add(link)
        if link.opened_here:
            self._dialed.add(link)
        self._links.setdefault(link.peer, []).append(link)

    async def _make_room(self) -> None:
        """Close the least recently used link (not an uplink) that is not carrying anything now."""
        idle = [link for link in self._closable if link.is_open and not link.busy]
        if not idle:
            return
        oldest = min(idle, key=lambda link: link.used_at)
        log.info(
            "closing the link with twin %s: %d links are open (--max-links, uplinks aside)",
            oldest.peer,
            len(self._closable),
            extra=about(twin=oldest.peer),
        )
        await oldest.retire(f"{self.max_links} links open at most")

    def _all_open(self) -> list[Link]:
        return [link for links in self._links.values() for link in links if link.is_open]

    async def _read(self, link: Link) -> None:
        try:
            await link.run()
        except Exception:
            log.exception("the link with twin %s failed", link.peer, extra=about(twin=link.peer))
        finally:
            self._closable.discard(link)
            self._dialed.discard(link)
            links = self._links.get(link.peer, [])
            if link in links:
                links.remove(link)
            if not links:
                self._links.pop(link.peer, None)
            log.info(
                "link with twin %s closed: %s",
                link.peer,
                link.closed_reason,
                extra=about(twin=link.peer),
            )
            link.mark_ended()
            await self.uplink_record.ended(link)
            if link.opened_here and not link.uplink and not self._closing and not link.retired:
                await self._broke(link.peer, link.closed_reason or "closed")

    async def _broke(self, twin_id: int, reason: str) -> None:
        """A link to ``twin_id`` broke (or was cut while opening); one that keeps breaking gives way to
        POSTs, unless it is kept whatever happens to it (an uplink, or every link of a site that is answered
        only over its links)."""
        if twin_id in self.uplinks or await self._way_back.only_over_links():
            return
        self._posts.broke(twin_id, reason)

    async def _link_url(self, twin_id: int) -> tuple[Twin, str]:
        """The twin and the URL of the link endpoint at its address."""
        try:
            twin = await self._resolver.get_twin(twin_id)
            return twin, peer_url(twin.address, LINK_PATH)
        except ResolverError as exc:
            raise DeliveryError(str(exc), kind="not_found") from exc
        except ValueError as exc:
            raise DeliveryError(f"twin {twin_id} has an unusable address {twin.address!r}: {exc}") from exc

    async def _open(
        self, twin_id: int | None, url: str, public_key: bytes | None, *, uplink: bool, to_relay: bool = False
    ) -> Link:
        """Open a link to twin ``twin_id`` at ``url`` (whose key is ``public_key``), or (``twin_id`` None) to
        the relay there, whichever twin it is; ``uplink``: kept open for the other end to send over it;
        ``to_relay``: this site's link to its relay."""
        socket, peer, peer_max_bytes, reads_parts = await self._handshakes.dial(
            twin_id, url, public_key, uplink=uplink
        )
        return Link(
            peer,
            socket,
            self._answer,
            opened_here=True,
            peer_max_bytes=peer_max_bytes,
            peer_reads_parts=reads_parts,
            max_bytes=self.max_frame_bytes,
            uplink=uplink,
            to_relay=to_relay,
            clock=self._clock,
        )


def _relay_origin(relay: str) -> str:
    try:
        return _origin(peer_url(relay, LINK_PATH))
    except ValueError:
        return relay


def _origin(url: str) -> str:
    """The site part of a URL: scheme, host and port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _nothing() -> None:
    pass
