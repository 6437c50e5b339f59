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
frame together and takes it as if it came whole. Each end has one writer that takes turns
(:mod:`msgbusd.link.link_writer`): the small frames, acks among them, go between the parts of large
ones instead of waiting seconds behind them on a thin cable, and little waits in the buffers below it
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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from msgbusd.errors import DeliveryError, peer_refusal
from msgbusd.identity.signing import SignatureError, Signer, verify_digest
from msgbusd.link.batching import batch_message, chunks
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_admission import BUSY_STATUS, RETRY_AFTER, come_back_in_s
from msgbusd.link.link_keepalive import opener_keepalive
from msgbusd.link.link_pacing import Pacing
from msgbusd.link.link_parts import PartError, Reassembly, is_part
from msgbusd.link.link_sockets import REFUSED, RETIRED, ClientSocket, LinkClosed, Socket
from msgbusd.link.link_writer import FairWriter
from msgbusd.link.loop_turns import LoopTurns
from msgbusd.link.peer_clocks import PeerClocks, read_stamp, stamp
from msgbusd.link.site_socket import LINK_PATH
from msgbusd.link.way_back import WayBack, reached_only_over_its_links
from msgbusd.reports.logs import about
from msgbusd.store.leases import first_set
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError, Twin
from wire.backoff import Backoff, sleep_unless
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES, envelope_size_limit
from wire.error_texts import too_large_text

log = logging.getLogger("msgbusd.links")

# Frames received and not yet answered, per link: a sender waits for acks once it has a few frames on their
# way (batch_window.WINDOW), so more means a flood.
INBOUND_FRAMES = 32
# Room in a frame for what wraps its envelopes (the op, the id, each message's path), and in an ack.
FRAME_OVERHEAD_BYTES = 4096
# A site that answers the upgrade with plain HTTP is sent POSTs this long before it is asked again, for every
# twin at its address (scheme, host and port): a daemon answering for many twins is asked once, not per twin.
RECHECK_S = 600.0
# A link opened here that breaks this many times within the window (a proxy or network that cuts long-lived
# connections, or loses much of what it carries) is given up for POSTs a while: each POST stands alone, while
# a link needs its handshake and every ack through.
FLAPPING_BREAKS = 3
FLAPPING_WINDOW_S = 60.0
FLAPPING_POSTS_S = 60.0
# Idle links are looked for this often at most.
IDLE_CHECK_S = 10.0
# An uplink that broke, or could not be opened, is dialed again after these delays, each anywhere from zero
# up to the backoff: the edges of a cloud site that restarts come back spread over seconds, not as a herd.
UPLINK_REDIAL = Backoff(base_s=0.25, max_s=5.0, full_jitter=True)
# Handshakes that check their hello and sign their welcome in one turn of the event loop, at most (each
# takes about a quarter of a millisecond).
CHECKS_PER_TURN = 8
# The key of this site's link to its relay among the uplinks' times (twin ids are positive).
RELAY_LINK = 0
# A sender waiting for a twin's uplink looks again this often (it is woken at once when the uplink opens).
UPLINK_WAIT_S = 30.0
# A link this site opened that carried nothing for this long (or --link-ping, when longer) is pinged: a
# proxy between the sites closes a tunnel idle for its timeout (often 30 or 60 s).
PING_EVERY_S = 25.0
# The links this site opened are looked at this often for their pings.
PING_SWEEP_S = 1.0
# A sweep of the pings that begins this much later than it was due finds this site itself late: it closes no
# link for a pong that may be waiting, unread, behind what made it late.
LATE_S = 0.5

# What an inbound frame's envelopes get: one result per message, {"status": 200} or status and message.
# Called with the twin at the other end, the messages, and whether the link is this site's link to its relay
# (which carries other twins' messages, encrypted for this site).
Answer = Callable[[int, list[Any], bool], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class Result:
    """A peer's answer to one envelope sent over a link."""

    status: int
    message: str = ""
    retry_after_s: float | None = None


class LinkUnsupported(Exception):
    """The peer's site answered the upgrade with plain HTTP: it is not a msgbus site."""


def handshake_digest(signer_twin: int, other_twin: int, nonce: str) -> bytes:
    """What a handshake signature covers: who signs, for whom, and the other side's fresh nonce."""
    return hashlib.sha256(f"msgbus-link\n{signer_twin}\n{other_twin}\n{nonce}".encode()).digest()


class Link:
    """An open link to twin ``peer``: sends frames and waits for their acks, answers the peer's frames in
    the order they came.

    One writer takes turns between this end's frames (:class:`~msgbusd.link.link_writer.FairWriter`):
    to a peer that reads parts (``peer_reads_parts``: it said so in the handshake) a large frame goes in
    parts, and the small frames behind it go between them. The peer's frames in parts are put together
    again, up to ``max_bytes`` (the largest envelope this end takes) and its wrapping each."""

    def __init__(
        self,
        peer: int,
        socket: Socket,
        answer: Answer,
        *,
        opened_here: bool,
        peer_max_bytes: int,
        peer_reads_parts: bool = False,
        max_bytes: int = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES),
        uplink: bool = False,
        to_relay: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.peer = peer
        self.opened_here = opened_here
        # Kept open by the edge end so that the other end can reach it: never closed for being idle.
        self.uplink = uplink
        # This site's link to its relay: what comes on it is from any twin, through the relay.
        self.to_relay = to_relay
        # Set once the link is closed and its reader has ended (made when first asked for).
        self._ended: asyncio.Event | None = None
        self._has_ended = False
        self._clock = clock
        # When a frame last went either way (pings do not count).
        self.used_at = clock()
        # Closed by this site because it was idle, or to make room for another: not a break.
        self.retired = False
        # The largest envelope the peer takes (it says so in the handshake).
        self.peer_max_bytes = peer_max_bytes
        self.peer_reads_parts = peer_reads_parts
        self._socket = socket
        self._answer = answer
        pacing = getattr(socket, "pacing", None)
        self._writer = FairWriter(
            socket.send,
            parts=peer_reads_parts,
            limit_unsent=pacing.limit_unsent if isinstance(pacing, Pacing) else None,
            unsent=pacing.unsent_bytes if isinstance(pacing, Pacing) else None,
        )
        self._parts = Reassembly(max_bytes + FRAME_OVERHEAD_BYTES)
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[list[Result]]] = {}
        # The peer's frames waiting for their answer, in order, and the task answering them while there are
        # some (a quiet link has none); the reader waits for room beyond INBOUND_FRAMES.
        self._inbound: list[tuple[int, list[Any]]] = []
        self._answerer: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._answering = False
        # Acks waiting for their turn to be written.
        self._acks: set[asyncio.Task[None]] = set()
        self._closed: str | None = None
        # When this end's ping still waiting for its pong was sent (monotonic), if one is.
        self._ping_sent_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self._closed is None

    @property
    def ended(self) -> asyncio.Event:
        """Set once the link is closed and its reader has ended (:meth:`mark_ended`)."""
        if self._ended is None:
            self._ended = asyncio.Event()
            if self._has_ended:
                self._ended.set()
        return self._ended

    def mark_ended(self) -> None:
        self._has_ended = True
        if self._ended is not None:
            self._ended.set()

    @property
    def closed_reason(self) -> str | None:
        return self._closed

    async def send(
        self, messages: Sequence[bytes], timeout_s: float, written: asyncio.Event | None = None
    ) -> list[Result]:
        """Send ``messages`` (each an encoded ``{"path", "envelope"}`` object) in one frame and wait for
        the peer's answer to each; raises :class:`LinkClosed` if the link ends or stalls first. ``written``
        is set once the frame is written, before its answer comes.

        ``timeout_s`` counts from when the frame's last piece was written: however long a large frame
        takes on a slow cable, the link is not closed for it (a link that makes no progress at all is
        found by the pings)."""
        if self._closed is not None:
            raise LinkClosed(self._closed, unsent=True)
        frame_id = self._next_id
        self._next_id += 1
        self.used_at = self._clock()
        answered: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = answered
        try:
            try:
                await self._write(b'{"op":"send","id":%d,"messages":[%b]}' % (frame_id, b",".join(messages)))
                if written is not None:
                    written.set()
            except LinkClosed as exc:
                # Not used again: the next send opens a new link.
                await self.close(str(exc))
                raise
            try:
                results = await asyncio.wait_for(answered, timeout_s)
            except TimeoutError:
                await self.close(f"no answer within {timeout_s:g}s")
                raise LinkClosed(f"no answer within {timeout_s:g}s") from None
        finally:
            self._pending.pop(frame_id, None)
            if answered.done() and not answered.cancelled():
                # Failed as the link ended while the frame was being written: the write's error is raised.
                answered.exception()
        if len(results) != len(messages):
            await self.close("an answer that does not match its frame")
            raise LinkClosed(f"{len(results)} results for {len(messages)} messages")
        return results

    async def run(self) -> None:
        """Read frames until the link closes; the peer's frames are answered one after the other, in order."""
        try:
            while (data := await self._socket.receive()) is not None:
                try:
                    frame = self._put_together(data) if is_part(data) else data
                except PartError as exc:
                    log.warning(
                        "closing the link with twin %s: %s", self.peer, exc, extra=about(twin=self.peer)
                    )
                    await self.close(f"unreadable part: {exc}", code=exc.code)
                    break
                if frame is not None and not await self._dispatch(frame):
                    break
        finally:
            self._closed = self._closed or self._socket.close_reason()
            self.retired = self.retired or self._socket.retired()
            await self._writer.close(self._closed)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(LinkClosed(self._closed))
            # The peer sends again, on its next link, the frames not answered yet; the one being answered
            # is let finish.
            self._inbound.clear()
            self._wake_room()
            if self._answerer is not None:
                with contextlib.suppress(asyncio.CancelledError, LinkClosed):
                    await self._answerer
            await self._socket.close(1000, self._closed)

    @property
    def busy(self) -> bool:
        """A frame of ours waits for its ack, or one of the peer's for its answer (or for the answer's turn to
        be written) or its next parts."""
        return (
            bool(self._pending)
            or self._answering
            or bool(self._inbound)
            or bool(self._acks)
            or self._parts.holding
        )

    async def keep_alive(self, now: float, every_s: float, *, may_close: bool) -> None:
        """Ping the other end when nothing came from it for ``every_s``; close the link when a ping's pong
        did not come within ``every_s`` either, unless ``may_close`` is False (this site itself is late).
        Only an end that notes when it last heard from the other (the opener's) pings."""
        socket = self._socket
        heard_at = getattr(socket, "heard_at", None)
        ping = getattr(socket, "ping", None)
        if not isinstance(heard_at, float) or ping is None or self._closed is not None:
            return
        if self._ping_sent_at is not None:
            if heard_at >= self._ping_sent_at:
                self._ping_sent_at = None
            else:
                if now - self._ping_sent_at >= every_s and may_close:
                    log.warning(
                        "closing the link with twin %s: no pong within %.0fs",
                        self.peer,
                        every_s,
                        extra=about(twin=self.peer),
                    )
                    await self.close(f"no pong within {every_s:g}s")
                return
        if now - heard_at >= every_s:
            self._ping_sent_at = now
            try:
                await ping()
            except LinkClosed as exc:
                await self.close(str(exc))

    async def retire(self, reason: str) -> None:
        """Close the link because this site no longer needs it (not a break: it opens again on need)."""
        self.retired = True
        await self.close(reason, code=RETIRED)

    async def close(self, reason: str, code: int = 1000) -> None:
        """Close the link; frames waiting for an answer fail with :class:`LinkClosed`."""
        if self._closed is None:
            self._closed = reason
        self._wake_room()
        await self._writer.close(self._closed)
        await self._socket.close(code, reason)

    async def _dispatch(self, data: bytes) -> bool:
        self.used_at = self._clock()
        try:
            frame = orjson.loads(data)
            op = frame["op"]
            frame_id = int(frame["id"])
            if op == "ack":
                self._acked(frame_id, frame["results"])
            elif op == "send":
                messages = frame["messages"]
                if not isinstance(messages, list):
                    raise TypeError("messages is not a list")
                await self._take_inbound(frame_id, messages)
            else:
                raise ValueError(f"unknown op {op!r}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("closing the link with twin %s: unreadable frame (%s)", self.peer, exc)
            await self.close(f"unreadable frame: {exc}", code=1003)
            return False
        return True

    def _put_together(self, part: bytes) -> bytes | None:
        """The peer's frame ``part`` completes, or None while more of it is to come."""
        self.used_at = self._clock()
        return self._parts.add(part)

    def _acked(self, frame_id: int, results: list[dict[str, Any]]) -> None:
        future = self._pending.get(frame_id)
        if future is None or future.done():
            return
        future.set_result(
            [
                Result(
                    int(result["status"]),
                    str(result.get("message", "")),
                    float(result["retry_after"]) if "retry_after" in result else None,
                )
                for result in results
            ]
        )

    async def _take_inbound(self, frame_id: int, messages: list[Any]) -> None:
        """Queue one of the peer's frames for its answer (waiting for room first: a flood waits in the
        socket, not here)."""
        while len(self._inbound) >= INBOUND_FRAMES and self._closed is None:
            self._room = asyncio.get_running_loop().create_future()
            await self._room
        if self._closed is not None:
            return
        self._inbound.append((frame_id, messages))
        if self._answerer is None:
            self._answerer = asyncio.ensure_future(self._answer_frames())

    def _wake_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    async def _answer_frames(self) -> None:
        try:
            while self._inbound and self._closed is None:
                frame_id, messages = self._inbound.pop(0)
                self._wake_room()
                self._answering = True
                try:
                    results = await self._answer(self.peer, messages, self.to_relay)
                    ack = orjson.dumps({"op": "ack", "id": frame_id, "results": results})
                    if self._writer.busy:
                        # Behind the parts of a large frame the ack waits its turn; the next frame is
                        # answered meanwhile (the peer matches acks by frame id).
                        self._write_later(ack)
                    else:
                        await self._write(ack)
                except LinkClosed:
                    # The peer sends the frame again on its next link; its envelopes are kept once.
                    return
                finally:
                    self._answering = False
                    self.used_at = self._clock()
        finally:
            self._answerer = None
            self._wake_room()

    async def _write(self, data: bytes) -> None:
        await self._writer.write(data)

    def _write_later(self, data: bytes) -> None:
        task = asyncio.ensure_future(self._writer.write(data))
        self._acks.add(task)
        task.add_done_callback(self._ack_written)

    def _ack_written(self, task: asyncio.Task[None]) -> None:
        self._acks.discard(task)
        if not task.cancelled():
            # A link that closed meanwhile: the peer sends the frame again on its next link.
            task.exception()


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
        # The peers' clocks, measured at each handshake (which is stamped with this site's).
        self.clocks = clocks or PeerClocks()
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
        # The twins this site keeps an uplink to (--uplink), and those that opened one to it in this run:
        # the latter are reached over their uplink only.
        self.uplinks = tuple(uplinks)
        self._uplinked: set[int] = set()
        # When each uplink last opened or closed (unix time), for msgbus status.
        self._uplink_since: dict[int, float] = {}
        # Called with the twin whose uplink to this site just opened.
        self.on_uplink: Callable[[int], None] = _ignore_uplink
        # Told when a twin's uplink to this site opens (True) or its last one closes (False): the site's
        # instance that sends to the twin is the one its uplink is open to.
        self.on_uplink_change: Callable[[int, bool], Awaitable[None]] | None = None
        self.idle_s = idle_s
        self.max_links = max_links
        self._signer = signer
        self._resolver = resolver
        self._http = http
        self._answer = answer
        self.timeout_s = timeout_s
        self._ping_s = ping_s
        self.max_frame_bytes = max_frame_bytes
        self._clock = clock
        self._links: dict[int, list[Link]] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._opening_relays: dict[str, asyncio.Lock] = {}
        # Twins sent POSTs until then (their links keep breaking), and sites (by origin) that take no links.
        self._posts_until: dict[int, float] = {}
        self._no_links_until: dict[str, float] = {}
        # Sites known to take links, and sites being asked for the first time (meanwhile their other twins
        # are sent POSTs rather than asked too).
        self._takes_links: set[str] = set()
        self._asking: set[str] = set()
        self._breaks: dict[int, deque[float]] = {}
        self._readers: set[asyncio.Task[None]] = set()
        # The handshakes of links opened to this site check and sign a few at a time in each turn of the
        # event loop: a herd's hellos come by the hundred.
        self._checking = LoopTurns(CHECKS_PER_TURN)
        self._closing = False
        # Links adopted whose reader has not ended yet that this site may close to make room (uplinks it
        # may not: an edge is reached over its uplink only), and those it opened itself (it pings them).
        self._closable: set[Link] = set()
        self._dialed: set[Link] = set()

    def open_count(self) -> int:
        return sum(1 for links in self._links.values() for link in links if link.is_open)

    async def close_idle(self) -> int:
        """Close the links that carried nothing for ``idle_s`` (either end's: the peer opens one again
        when it has work); returns how many."""
        now = self._clock()
        idle = [
            link
            for link in self._all_open()
            if not link.busy
            and not link.uplink
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
        if twin_id in self._uplinked or (twin is not None and self._by_uplink_only(twin)):
            if twin_id not in self._uplinked:
                # Listed among the uplinks (closed, since now) while what waits for it waits.
                self._uplinked.add(twin_id)
                self._uplink_since[twin_id] = time.time()
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
        if not (open_new or keeps_link) or (
            not keeps_link and self._posts_until.get(twin_id, 0.0) > self._clock()
        ):
            return None
        lock = self._opening.setdefault(twin_id, asyncio.Lock())
        async with lock:
            link = self._current(twin_id, replies_only)
            if link is not None:
                return link
            if not keeps_link and self._posts_until.get(twin_id, 0.0) > self._clock():
                return None
            twin, url = await self._link_url(twin_id)
            origin = _origin(url)
            if self._no_links_until.get(origin, 0.0) > self._clock():
                return None
            first_ask = origin not in self._takes_links
            if first_ask:
                if origin in self._asking:
                    return None
                self._asking.add(origin)
            # A link to the site of this site's own relay is the link to its relay, however it is opened.
            to_relay = self._is_own_relay(origin)
            try:
                uplink = twin_id in self.uplinks or to_relay
                link = await self._open(twin_id, url, twin.public_key, uplink=uplink, to_relay=to_relay)
            except LinkUnsupported as exc:
                self._takes_links.discard(origin)
                self._no_links_until[origin] = self._clock() + RECHECK_S
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
                    self._posts_until[twin_id] = self._clock() + exc.retry_after_s
                    log.info("%s; sending it POSTs meanwhile", exc.cause, extra=about(twin=twin_id))
                    return None
                if exc.offline:
                    await self._broke(twin_id, exc.cause)
                raise
            finally:
                if first_ask:
                    self._asking.discard(origin)
            self._takes_links.add(origin)
            if to_relay:
                self._relay_twins[origin] = link.peer
            await self._start_reading(link)
            return link

    async def serve(self, socket: Socket) -> None:
        """``/zbus-link``: a peer opened a link to this site (its upgrade was taken; the handshake is
        next)."""
        try:
            # A timeout of the task itself rather than wait_for's, whose failure is a cycle (its inner task
            # holds the error, whose traceback holds the task) that waits for the cyclic collector.
            async with asyncio.timeout(self.timeout_s):
                peer, peer_max_bytes, uplink, reads_parts = await self._greet(socket)
        except (TimeoutError, _Refused, LinkClosed) as exc:
            reason = str(exc) if isinstance(exc, _Refused) else "no handshake in time"
            if not isinstance(exc, LinkClosed):
                log.warning("refused a link: %s", reason)
                await socket.close(REFUSED, reason)
            return
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
            self._uplinked.add(peer)
            self._uplink_since[peer] = time.time()
            kind = "its uplink" if link_is_uplink else "a link (its way back: it has no address)"
            log.info("twin %s opened %s to this site", peer, kind, extra=about(twin=peer))
            await self._retire_older_uplinks(link)
            await self._tell_uplink_change(peer, opened=True)
            self.on_uplink(peer)
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

    async def _retire_older_uplinks(self, newest: Link) -> None:
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
                    self._keep_uplink(
                        f"twin {twin_id}", twin_id, functools.partial(self.link_to, twin_id), stopping
                    ),
                    name=f"uplink to twin {twin_id}",
                )
            if self.relay:
                group.create_task(
                    self._keep_uplink("the relay", RELAY_LINK, self._dial_relay, stopping), name="relay link"
                )

    async def _dial_relay(self) -> Link | None:
        # The twin entry may name another relay by now: the link goes where it says.
        own = await self._known_twin(self._twin)
        if own is not None and own.relay:
            self.relay = own.relay
        return await self.link_to_relay(self.relay, uplink=True)

    async def _keep_uplink(
        self, name: str, key: int, dial: Callable[[], Awaitable[Link | None]], stopping: asyncio.Event
    ) -> None:
        failures = 0
        while not stopping.is_set() and not self._closing:
            try:
                link = await dial()
                cause = f"the site of {name} takes no links"
            except DeliveryError as exc:
                link, cause = None, exc.cause
                if exc.kind == "busy" and exc.retry_after_s is not None:
                    # Turned away by a site letting a herd in: back at the turn it gave, as no failure.
                    log.info("uplink to %s: %s", name, cause)
                    self._uplink_since.setdefault(key, time.time())
                    await sleep_unless(stopping, exc.retry_after_s)
                    continue
            except Exception as exc:
                log.exception("opening the uplink to %s failed", name)
                link, cause = None, str(exc)
            if link is not None:
                log.info("uplink to %s is open", name, extra=about(twin=link.peer))
                self._uplink_since[key] = time.time()
                failures = 0
                await first_set(link.ended, stopping)
                if stopping.is_set() or self._closing:
                    return
                cause = f"closed: {link.closed_reason}"
                self._uplink_since[key] = time.time()
            elif failures == 0:
                self._uplink_since.setdefault(key, time.time())
            failures += 1
            delay_s = UPLINK_REDIAL.delay_s(failures)
            log.warning("uplink to %s: %s; dialing again in %.1fs", name, cause, delay_s)
            await sleep_unless(stopping, delay_s)

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
                    "since": self._uplink_since.get(RELAY_LINK),
                }
            )
        return relay + [
            {
                "twin": twin_id,
                "direction": "out" if opened_here else "in",
                "open": self._uplink(twin_id, opened_here=opened_here) is not None,
                "since": self._uplink_since.get(twin_id),
            }
            for twin_id, opened_here in [
                *((twin_id, True) for twin_id in self.uplinks),
                *((twin_id, False) for twin_id in sorted(self._uplinked)),
            ]
        ]

    async def _tell_uplink_change(self, twin_id: int, *, opened: bool) -> None:
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

    def current_uplink(self, twin_id: int) -> Link | None:
        """The open uplink ``twin_id`` opened to this site, if any."""
        return self._uplink(twin_id, opened_here=False)

    def _uplink(self, twin_id: int, *, opened_here: bool) -> Link | None:
        for link in self._links.get(twin_id, ()):
            if link.is_open and link.uplink and link.opened_here == opened_here:
                return link
        return None

    async def reached_by_uplink(self, twin_id: int) -> bool:
        """``twin_id`` opened an uplink to this site (in this run), or has no address: it is reached over
        its uplink, and nothing is sent to it while none is open."""
        if twin_id in self._uplinked:
            return True
        twin = await self._known_twin(twin_id)
        return twin is not None and self._by_uplink_only(twin)

    def _by_uplink_only(self, twin: Twin) -> bool:
        if twin.relay:
            return self.relays_for_others
        return not twin.address.strip()

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
        if link is not None or not open_new or self._no_links_until.get(origin, 0.0) > self._clock():
            return link
        lock = self._opening_relays.setdefault(origin, asyncio.Lock())
        async with lock:
            link = self._relay_link(origin)
            if link is not None:
                return link
            try:
                link = await self._open(None, url, None, uplink=uplink, to_relay=to_relay)
            except LinkUnsupported as exc:
                self._no_links_until[origin] = self._clock() + RECHECK_S
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
            if link.uplink and not link.opened_here and self._uplink(link.peer, opened_here=False) is None:
                self._uplink_since[link.peer] = time.time()
                await self._tell_uplink_change(link.peer, opened=False)
            if link.opened_here and not link.uplink and not self._closing and not link.retired:
                await self._broke(link.peer, link.closed_reason or "closed")

    async def _broke(self, twin_id: int, reason: str) -> None:
        """A link to ``twin_id`` broke (or was cut while opening); one that keeps breaking gives way to
        POSTs, unless it is kept whatever happens to it (an uplink, or every link of a site that is answered
        only over its links)."""
        if twin_id in self.uplinks or await self._way_back.only_over_links():
            return
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
        what = f"twin {twin_id}" if twin_id is not None else "the relay"
        try:
            ws = await self._http.websocket(
                "ws" + url.removeprefix("http"),
                max_message_bytes=self.max_frame_bytes + 4096,
                timeout_s=self.timeout_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            turn_s = come_back_in_s(exc.headers.get(RETRY_AFTER)) if exc.headers is not None else None
            if exc.status == BUSY_STATUS and turn_s is not None:
                raise DeliveryError(
                    f"the site of {what} at {url} lets no more links begin now: "
                    f"dialing again in {turn_s:.1f}s",
                    kind="busy",
                    retry_after_s=turn_s,
                ) from exc
            if exc.status in (502, 503, 504):
                raise DeliveryError(
                    f"{what} at {url} cannot take messages now: {exc.status}", offline=True
                ) from exc
            raise LinkUnsupported(f"the upgrade was answered {exc.status}") from exc
        except TimeoutError as exc:
            raise DeliveryError(f"{what} at {url} did not answer in time", offline=True) from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"couldn't reach {what} at {url}: {exc}", offline=True) from exc
        socket = ClientSocket(ws)
        opener_keepalive(self._ping_s).apply_to(socket.pacing.transport)
        try:
            async with asyncio.timeout(self.timeout_s):
                peer, peer_max_bytes, reads_parts = await self._introduce(
                    socket, twin_id, public_key, uplink=uplink
                )
        except TimeoutError as exc:
            await socket.close(1000, "no handshake in time")
            raise DeliveryError(f"{what} at {url} did not answer in time", offline=True) from exc
        except LinkClosed as exc:
            await socket.close(1000, str(exc))
            if exc.refused:
                raise DeliveryError(f"{what} at {url} refused a link: {exc}", kind="refused") from exc
            # Cut during the handshake: like a connection that failed.
            raise DeliveryError(f"couldn't reach {what} at {url}: {exc}", offline=True) from exc
        log.info("opened a link to %s at %s (twin %s)", what, url, peer, extra=about(twin=peer))
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

    async def _introduce(
        self, socket: Socket, twin_id: int | None, public_key: bytes | None, *, uplink: bool
    ) -> tuple[int, int, bool]:
        """The opener's half of the handshake: the twin at the other end (``twin_id``, or for a relay the
        twin it proves to be), the largest envelope its site takes, and whether it reads frames in parts.
        Raises :class:`LinkClosed` when it fails."""
        challenge = _frame(await socket.receive(), "challenge", socket)
        if twin_id is None or public_key is None:
            twin_id, public_key = await self._relay_identity(challenge.get("twin"))
        elif challenge.get("twin") != twin_id:
            raise LinkClosed(
                f"the site there is twin {challenge.get('twin')}, not twin {twin_id}", refused=True
            )
        nonce = os.urandom(16).hex()
        their_nonce = str(challenge.get("nonce", ""))
        sig = self._signer.sign_digest(handshake_digest(self._twin, twin_id, their_nonce)).hex()
        hello: dict[str, Any] = {"op": "hello", "twin": self._twin, "nonce": nonce, "sig": sig}
        if uplink:
            hello["uplink"] = True
        sent_at = self.clocks.now()
        hello |= stamp(self._signer, self._twin, twin_id, their_nonce, sent_at)
        await socket.send(orjson.dumps({**hello, "max_bytes": self.max_frame_bytes, "parts": True}))
        welcome = _frame(await socket.receive(), "welcome", socket)
        received_at = self.clocks.now()
        try:
            digest = handshake_digest(twin_id, self._twin, nonce)
            verify_digest(str(welcome.get("sig", "")), digest, public_key)
        except SignatureError as exc:
            raise LinkClosed(f"the site there is not twin {twin_id}: {exc.message}", refused=True) from exc
        peer_time_s = read_stamp(welcome, twin_id, self._twin, nonce, public_key)
        if peer_time_s is not None:
            self.clocks.measured_on_link(twin_id, peer_time_s, sent_at, received_at)
        return twin_id, _max_bytes(challenge, self.max_frame_bytes), challenge.get("parts") is True

    async def _relay_identity(self, claimed: object) -> tuple[int, bytes]:
        """A relay is named by its address only: it is whichever twin it says, once it proves it holds that
        twin's key (its welcome is checked against it)."""
        if not isinstance(claimed, int) or isinstance(claimed, bool) or claimed <= 0:
            raise LinkClosed(f"the relay says it is twin {claimed!r}", refused=True)
        try:
            return claimed, (await self._resolver.get_twin(claimed)).public_key
        except ResolverError as exc:
            raise LinkClosed(f"couldn't get the relay's twin {claimed}: {exc}", refused=True) from exc

    async def _greet(self, socket: Socket) -> tuple[int, int, bool, bool]:
        """The site's half of the handshake: the opener's twin, once it proved it holds that twin's key, the
        largest envelope the opener takes, whether it opens the link as its uplink, and whether it reads
        frames in parts."""
        nonce = os.urandom(16).hex()
        challenge = {
            "op": "challenge",
            "twin": self._twin,
            "nonce": nonce,
            "max_bytes": self.max_frame_bytes,
            "parts": True,
        }
        sent_at = self.clocks.now()
        await socket.send(orjson.dumps(challenge))
        try:
            hello = _frame(await socket.receive(), "hello", socket)
            received_at = self.clocks.now()
            peer = int(hello["twin"])
        except (LinkClosed, KeyError, TypeError, ValueError) as exc:
            raise _Refused(f"no valid hello: {exc}") from exc
        try:
            twin = await self._resolver.get_twin(peer)
        except ResolverError as exc:
            raise _Refused(f"couldn't get twin {peer} public key: {exc}") from exc
        await self._checking.take()
        try:
            digest = handshake_digest(peer, self._twin, nonce)
            verify_digest(str(hello.get("sig", "")), digest, twin.public_key)
        except SignatureError as exc:
            raise _Refused(f"not signed by twin {peer}: {exc.message}") from exc
        their_nonce = str(hello.get("nonce", ""))
        peer_time_s = read_stamp(hello, peer, self._twin, nonce, twin.public_key)
        if peer_time_s is not None:
            self.clocks.measured_on_link(peer, peer_time_s, sent_at, received_at)
        sig = self._signer.sign_digest(handshake_digest(self._twin, peer, their_nonce)).hex()
        welcome = {
            "op": "welcome",
            "sig": sig,
            **stamp(self._signer, self._twin, peer, their_nonce, self.clocks.now()),
        }
        await socket.send(orjson.dumps(welcome))
        uplink = hello.get("uplink") is True
        return peer, _max_bytes(hello, self.max_frame_bytes), uplink, hello.get("parts") is True


async def send_envelopes(
    link: Link, items: Sequence[tuple[str, bytes]], timeout_s: float, written: asyncio.Event | None = None
) -> list[DeliveryError | None]:
    """Send ``(path, signed envelope)`` pairs over ``link``, in order, as few frames as the peer's size
    limit allows; one result per item (None: the peer has it). ``written`` is set once the last frame is
    written (what is written after it comes after all of them)."""
    twin_id, limit = link.peer, link.peer_max_bytes
    results: list[DeliveryError | None] = [None] * len(items)
    sendable: list[int] = []
    messages: list[bytes] = []
    for index, (path, envelope) in enumerate(items):
        if len(envelope) > limit:
            # The peer said how much it takes when the link opened: this one it would refuse.
            results[index] = peer_refusal(twin_id, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large_text(limit))
            continue
        sendable.append(index)
        messages.append(batch_message(path, envelope))
    done = 0
    for chunk in chunks(messages, limit):
        indexes = sendable[done : done + len(chunk)]
        done += len(chunk)
        try:
            answers = await link.send(chunk, timeout_s, written if done == len(messages) else None)
        except LinkClosed as exc:
            error = DeliveryError(f"the link to twin {twin_id} broke: {exc}", offline=True)
            for index in indexes:
                results[index] = error.not_attempted() if exc.unsent else error
            for index in sendable[done:]:
                results[index] = error.not_attempted()
            return results
        for index, answer in zip(indexes, answers, strict=True):
            if answer.status != 200:
                results[index] = peer_refusal(twin_id, answer.status, answer.message, answer.retry_after_s)
    return results


def _relay_origin(relay: str) -> str:
    try:
        return _origin(peer_url(relay, LINK_PATH))
    except ValueError:
        return relay


def _origin(url: str) -> str:
    """The site part of a URL: scheme, host and port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Refused(Exception):
    """A handshake this site refuses; the message is the close reason."""


def _max_bytes(frame: dict[str, Any], default: int) -> int:
    value = frame.get("max_bytes")
    return value if isinstance(value, int) and value > 0 else default


def _frame(data: bytes | None, op: str, socket: Socket) -> dict[str, Any]:
    if data is None:
        raise LinkClosed(socket.close_reason(), refused=socket.refused())
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LinkClosed(f"expected {op}, got something unreadable", refused=True) from exc
    if not isinstance(frame, dict) or frame.get("op") != op:
        raise LinkClosed(f"expected {op}", refused=True)
    return frame


def _nothing() -> None:
    pass


def _ignore_uplink(twin_id: int) -> None:
    pass


def waiting_for_link_text(twin_id: int, twin: Twin | None) -> str:
    """Why nothing goes to ``twin_id`` now: it is reached only over a link it opens, and none is open."""
    if twin is not None and reached_only_over_its_links(twin):
        return (
            f"twin {twin_id} has no address: it is reached over a link it opens to this site, "
            "and none is open"
        )
    return f"twin {twin_id} is reached over the uplink it opens to this site, and none is open"
