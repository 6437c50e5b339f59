"""How a message leaves this site: one :class:`Peer` per destination twin owns everything on the way out.

1. A request a local client pushed, or a service's reply to a peer's request, is accepted by a handler
   (:mod:`msgbusd.door.handlers`) in one script that also appends it to its destination's send queue in Redis,
   then handed to the destination's peer (:meth:`Peers.kick`).
2. The peer's sender reads the head of that queue (or takes what was just accepted straight from memory
   while memory and the queue are known to be in step), stamps and signs each envelope, and sends up to
   :data:`~msgbusd.sending.lanes.BATCH` of them at once: over the link to a msgbus site
   (:mod:`msgbusd.link.links`), or in POSTs to a site that takes no links (go-rmb, or ``--no-links``;
   :mod:`msgbusd.sending.posts`). On a link up to :data:`~msgbusd.sending.batch_window.WINDOW` batches are
   on their way at once, each read after the ones before it (from memory or the queue); those with requests
   all on one link, so that one that breaks fails the ones after it too.
3. Every envelope gets its own answer. The queue is popped, in order, only once the peer has them (or once
   their failure is in the schedule), so what waits for a slow or absent peer stays in Redis, in order, not
   in memory; a crash at any point sends again, and the receiver drops what it already has.
4. A refusal is the message's own failure: :mod:`msgbusd.sending.schedule` counts the try and moves it to the
   retry schedule, from where the timer puts it back in the send queue when it is due (or it gets its final
   error). A 503 with ``Retry-After`` is sent again after that long, costing no try.
5. No answer at all is the peer's failure (:mod:`msgbusd.sending.health`): the peer is down, and from then on
   it is sent nothing but a probe every second or two while its messages wait in the queue (the schedule
   gives up those whose tries or lifetime run out). The first probe that gets an answer lets the whole
   queue flow again at batch speed.

At most ``workers`` peers that answer have a sender at once (a peer that is down needs none of these: its
sender mostly waits for its next probe); a peer with work but no free sender waits in line with what was
just queued for it (within bounds; its work is in Redis anyway), and idle senders stop to make room for it.
At most ``workers`` send and ``workers`` probe at once. A peer's sender stops when its queue has been empty a
while, and starts again when kicked. A new sender whose send queue held nothing before what it was handed
(a twin talked to for the first time, or again after a while) sends it from memory at once.

Here is the set of peers (:class:`Peers`), which hands work to each and keeps the sender places. Each part
of a peer's sending reads on its own: the peer and its sender (:mod:`msgbusd.sending.peer`), what it knows
of its queue (:mod:`msgbusd.sending.lanes`), the batches on their way (:mod:`msgbusd.sending.batch_window`),
the wire (:mod:`msgbusd.sending.transmit`), large messages (:mod:`msgbusd.sending.large_sends`), and what
all the senders share (:mod:`msgbusd.sending.senders`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence, Set
from typing import Any

from msgbusd.errors import DeliveryError
from msgbusd.identity.sealing import Sealer
from msgbusd.identity.signing import Signer
from msgbusd.link.links import Links
from msgbusd.link.way_back import WayBack
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics
from msgbusd.reports.peer_activity import PeerActivityLog
from msgbusd.sending.health import HealthState, ProbePace, probe_backoff
from msgbusd.sending.lanes import Kept, Lane
from msgbusd.sending.peer import Peer
from msgbusd.sending.peer_report import PeerReport
from msgbusd.sending.posts import PostClient
from msgbusd.sending.schedule import Schedule
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.leases import Leases
from msgbusd.store.queues import Store
from twin_resolver.base import Resolver, ResolverError, Twin
from wire import event_schema as ev

log = logging.getLogger("msgbusd.peers")

# What is kept for all the twins waiting for a sender's place together (the others read theirs from Redis).
KEPT_WAITING = 20_000

# Peers forgets a peer once it is up and idle: one it no longer holds is up.
UP = HealthState("up")

SpawnTask = Callable[[Coroutine[Any, Any, None], str], None]


class Peers:
    """The peers this site sends to, each with a sender while it has something to send."""

    def __init__(
        self,
        store: Store,
        items: SendItems,
        schedule: Schedule,
        posts: PostClient,
        signer: Signer,
        sealer: Sealer,
        resolver: Resolver,
        spawn: SpawnTask,
        stopping: asyncio.Event,
        *,
        links: Links | None = None,
        leases: Leases | None = None,
        probe_s: float = 1.0,
        probe_rate: float = 0.0,
        workers: int = 1000,
        link_after: int = 2,
        large_message_bytes: int = 65536,
        way_back: WayBack | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.store = store
        # How other sites answer this one (None: at its address, as far as this site knows).
        self.way_back = way_back
        # A message with a larger payload is sent beside the others (0: none is).
        self.large_message_bytes = large_message_bytes
        self.items = items
        self.schedule = schedule
        self.posts = posts
        self.links = links
        self.links_timeout_s = links.timeout_s if links is not None else 0.0
        # The site's instances share the destinations (None: this process is the whole site).
        self.leases = leases
        self.stopping = stopping
        self.probes = probe_backoff(probe_s)
        self.probe_pace = ProbePace(probe_rate)
        # A link to a twin is opened once this many messages go to it at once (or it is busy).
        self.link_after = link_after
        self.turns = asyncio.Semaphore(workers)
        self.probe_turns = asyncio.Semaphore(workers)
        # Senders of peers that answer: places free, the twins waiting for one (in order, with what was kept
        # for them; all their work is in Redis), and the word to idle senders that one is wanted.
        self._places = self._free_places = workers
        self._waiting: dict[int, Kept] = {}
        # Items kept for the twins waiting, all together (beyond KEPT_WAITING, a twin's are read from Redis).
        self._kept_waiting = 0
        # The idle senders' lanes, the longest idle first.
        self._idle_lanes: dict[Lane, None] = {}
        self._stop_watched = False
        self.clock = clock
        self.metrics = metrics or Metrics()
        self._events = events or EventLog(None, 0)
        self.activity = PeerActivityLog(clock=clock)
        self._signer = signer
        self._resolver = resolver
        self.sealer = sealer
        self._spawn = spawn
        # Peers with a sender, and peers that are down (their state outlives their sender).
        self._peers: dict[int, Peer] = {}
        # What was queued for destinations whose lease is being claimed.
        self._claiming: dict[int, Kept] = {}

    def down_count(self) -> int:
        """How many peers are down."""
        return sum(1 for peer in self._peers.values() if peer.health.is_down)

    def report(self, active_within_s: float) -> list[PeerReport]:
        """Every peer that is down, has a sender, or was sent to or failed within ``active_within_s``."""
        now = self.clock()
        activity = self.activity.active_since(now - active_within_s)
        reports = []
        for twin in sorted(self._peers.keys() | activity.keys()):
            peer = self._peers.get(twin)
            health = peer.health.state() if peer is not None else UP
            reports.append(PeerReport.of(twin, health, activity.get(twin), now))
        return reports

    def kick_all(self, ready: Mapping[int, Sequence[SendItem] | None], alone: Set[int] = frozenset()) -> None:
        """:meth:`kick` each destination of ``ready``; those of ``alone`` have nothing else queued."""
        for dst, items in ready.items():
            self.kick(dst, items, alone=dst in alone)

    def holds(self, dst: int) -> bool:
        """This instance sends to ``dst`` (another instance of the site may)."""
        return self.leases is None or self.leases.holds(str(dst))

    def kick(self, dst: int, items: Sequence[SendItem] | None = None, *, alone: bool = False) -> None:
        """``items`` were just queued for ``dst`` (None: something was, not known what): wake its sender,
        handing them over, or start one; or, when another instance sends to ``dst``, have it told.
        ``alone``: the send queue holds nothing else, so a new sender sends them from memory at once."""
        if not self.holds(dst):
            assert self.leases is not None
            name = str(dst)
            carried = self.items.pack(items) if items and self.leases.holder_known(name) else None
            if self.leases.want(name, carried):
                self._keep_until_claimed(dst, items, alone)
            return
        peer = self._peers.get(dst)
        lane = peer.lane if peer is not None else None
        if lane is None:
            if self.stopping.is_set():
                return
            needs_place = peer is None or not peer.health.is_down
            if needs_place and not self._take_place(dst, items, alone):
                return
            if peer is None:
                peer = self._peers[dst] = Peer(dst, self)
            peer.has_place = needs_place
            lane = peer.lane = Lane(trusted=alone and bool(items))
            self._spawn(peer.run(lane), f"sender to twin {dst}")
        if items is None:
            lane.distrust()
            lane.missed = True
        else:
            lane.queued(items)
        lane.wake.set()

    def _keep_until_claimed(self, dst: int, items: Sequence[SendItem] | None, alone: bool) -> None:
        """Keep what was queued for ``dst`` while its lease is claimed: if this instance gains it, its new
        sender sends that from memory rather than reading the queue back."""
        if dst in self._claiming:
            self._claiming[dst].add(items)
        else:
            self._claiming[dst] = Kept.of(items, alone)

    def gained(self, dst: int, *, resumed: bool) -> None:
        """This instance now holds ``dst``'s lease (or holds it still, and work was found waiting for it):
        start its sender, with what was kept while the lease was claimed; one taken over from another
        instance (``resumed``) probes its peer first."""
        kept = self._claiming.pop(dst, None)
        if resumed:
            self.resume_one(dst)
        elif kept is not None:
            self.kick(dst, kept.items, alone=kept.alone)
        else:
            self._look_again(dst)

    def _look_again(self, dst: int) -> None:
        """Work this instance was not told of may wait for ``dst``: a sender in step with its queue, or a twin
        waiting for a place with all its work known, reads the queue once it has sent what it knows (which
        was queued first); any other is kicked as for unknown work."""
        peer = self._peers.get(dst)
        lane = peer.lane if peer is not None else None
        waiting = self._waiting.get(dst)
        if lane is not None and lane.trusted:
            lane.recheck = True
            lane.wake.set()
        elif lane is None and waiting is not None and waiting.alone and waiting.items is not None:
            waiting.recheck = True
        else:
            self.kick(dst)

    def unattended(self, dst: int) -> None:
        """``dst``, whose lease this instance holds, has work waiting in Redis: start its sender if it has
        none (and does not wait for a place or its lease), so that no work is left without one."""
        peer = self._peers.get(dst)
        if (peer is None or peer.lane is None) and dst not in self._waiting and dst not in self._claiming:
            self.kick(dst)

    def held_elsewhere(self, dst: int) -> None:
        """Another instance holds ``dst``'s lease (it was told of the work): nothing kept here is sent."""
        self._claiming.pop(dst, None)

    def kick_carried(self, dst: int, carried: bytes | None) -> None:
        """Another instance of the site queued work for ``dst`` and told this one, which sends to it:
        :meth:`kick` with the items it carried (none, or unreadable ones: they are read from Redis)."""
        items = None
        if carried is not None:
            try:
                items = self.items.unpack(carried)
            except ValueError as exc:
                log.error("work announced for twin %s is unreadable (%s); reading it from redis", dst, exc)
        self.kick(dst, items)

    def resume_one(self, dst: int) -> None:
        """Start a sender for ``dst``, which may have messages another run (or instance) left; it probes
        its peer before it sends."""
        peer = self._peers.setdefault(dst, Peer(dst, self))
        peer.health.unknown()
        self.kick(dst)

    def uplink_opened(self, dst: int) -> None:
        """``dst`` opened its uplink to this site: what waits for it goes now, without waiting for a probe."""
        peer = self._peers.get(dst)
        if peer is None:
            return
        if peer.health.is_down:
            peer.health.busy(0.0)
        peer.uplink_opened.set()
        if peer.lane is not None:
            peer.lane.wake.set()

    def wake(self, dst: int) -> None:
        """Have ``dst``'s sender look again at once (its lease is going), also while it pauses."""
        peer = self._peers.get(dst)
        if peer is not None and peer.lane is not None:
            peer.lane.wake.set()
            peer.lease_going.set()

    def stopped(self, peer: Peer, lane: Lane) -> None:
        """``peer``'s sender ended; a peer that is up is forgotten until it has something to send."""
        if peer.lane is lane:
            peer.lane = None
            gone = not peer.health.is_down or not self.holds(peer.twin)
            if gone and self._peers.get(peer.twin) is peer:
                del self._peers[peer.twin]
                if self.leases is not None and not self.stopping.is_set():
                    # Claimed again when there is something to send to it.
                    self.leases.free(str(peer.twin))
            self.leave_place(peer)

    def _take_place(self, dst: int, items: Sequence[SendItem] | None, alone: bool) -> bool:
        """A sender place for ``dst``, or False: it waits in line with ``items`` (just queued for it; kept
        within bounds), and an idle sender is asked to stop (:meth:`make_room`)."""
        if self._free_places > 0 and not self._waiting:
            self._free_places -= 1
            return True
        if dst in self._waiting:
            self._kept_waiting += self._waiting[dst].add(items)
        else:
            kept = self._waiting[dst] = Kept.of(items if self._kept_waiting < KEPT_WAITING else None, alone)
            self._kept_waiting += len(kept)
            self.make_room()
        return False

    def make_room(self) -> None:
        """Ask the sender idle the longest (and not asked yet) to stop, for the next twin in line: one sender
        a twin, so that a line forming does not stop every idle sender at once (a thousand of them stopping
        in one turn of the loop held up everything else for tens of milliseconds)."""
        if not self._waiting:
            return
        for lane in self._idle_lanes:
            if not lane.give_way:
                lane.give_way = True
                lane.wake.set()
                return

    def sender_places(self) -> tuple[int, int]:
        """How many senders hold a place, and how many twins wait for one."""
        return self._places - self._free_places, len(self._waiting)

    @property
    def place_wanted(self) -> bool:
        """A twin waits for a sender's place."""
        return bool(self._waiting)

    @contextlib.contextmanager
    def idling(self, lane: Lane) -> Iterator[None]:
        """While ``lane``'s sender idles: woken when a twin wants its place or the daemon stops."""
        if not self._stop_watched:
            self._stop_watched = True
            self._spawn(self._wake_idle_at_stop(), "idle senders' wake at stop")
        self._idle_lanes[lane] = None
        try:
            yield
        finally:
            self._idle_lanes.pop(lane, None)

    async def _wake_idle_at_stop(self) -> None:
        await self.stopping.wait()
        for lane in self._idle_lanes:
            lane.wake.set()

    def leave_place(self, peer: Peer) -> None:
        """``peer``'s sender gives its place back (it stopped, or the peer is down); the next twin in line
        gets it."""
        if not peer.has_place:
            return
        peer.has_place = False
        self._free_places += 1
        while self._free_places > 0 and self._waiting and not self.stopping.is_set():
            dst = next(iter(self._waiting))
            kept = self._waiting.pop(dst)
            self._kept_waiting -= len(kept)
            self._free_places -= 1
            self._start_waiting(dst, kept)

    def _start_waiting(self, dst: int, kept: Kept) -> None:
        """Start the sender of ``dst``, which waited for a place: it sends what was kept from memory, or
        reads its work from Redis."""
        if dst in self._peers or not self.holds(dst):
            # It got a sender meanwhile, or is known down (which needs no place), or another instance sends
            # to it now: the place goes back, and it is kicked as any twin with new work (what was kept may
            # have been sent since: its sender reads the queue).
            self._free_places += 1
            self.kick(dst)
            return
        peer = self._peers[dst] = Peer(dst, self)
        peer.has_place = True
        lane = peer.lane = Lane(trusted=kept.alone, recheck=kept.recheck)
        if kept.items is not None:
            lane.queued(kept.items)
        self._spawn(peer.run(lane), f"sender to twin {dst}")

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``work`` beside the senders (the daemon waits for it, or cancels it, when it stops)."""
        self._spawn(work, what)

    async def relayed_twin(self, twin_id: int) -> Twin | None:
        """``twin_id``'s entry when it names a relay (what is sent to it is encrypted for it), else None."""
        try:
            twin = await self._resolver.get_twin(twin_id)
        except ResolverError:
            return None
        return twin if twin.relay else None

    def sign(self, item: SendItem, seal_for: Twin | None = None) -> bytes:
        """``item``'s envelope as it goes on the wire now: stamped with the time, its payload encrypted for
        ``seal_for`` (a twin reached through a relay), signed, encoded. A message this site relays goes as
        its source signed it."""
        if item.relayed:
            return item.envelope.encode()
        env = item.envelope.replace(now=int(self.clock()))
        if seal_for is not None:
            env = self.sealer.seal(env, seal_for)
        return self._signer.sign(env).encode()

    def count_sent(self, items: list[SendItem]) -> list[str]:
        """The peer has these: count them; returns the keys of the replies among them, for the sender to
        forget (requests now wait for their reply)."""
        replies = [item.reply_key for item in items if not item.is_request]
        relayed = sum(item.relayed for item in items)
        if relayed:
            self.metrics.message("relay_forwarded", relayed)
        if len(replies) > relayed:
            self.metrics.message("reply_sent", len(replies) - relayed)
        if len(replies) < len(items):
            self.metrics.message("sent", len(items) - len(replies))
        if log.isEnabledFor(logging.DEBUG):
            for item in items:
                env = item.envelope
                log.debug(
                    "sent %s to twin %s",
                    item.entry,
                    env.dst[0],
                    extra=about(uid=env.uid, cmd=env.cmd, dst=env.dst[0]),
                )
        return replies

    def record_attempt(
        self, item: SendItem, error: DeliveryError | None, started_at: float, duration_us: int
    ) -> None:
        """The event log's line for one send of a request or a reply (``item.envelope`` went on the wire)."""
        if not self._events.enabled or item.relayed:
            return
        env = item.envelope
        if item.original is not None:
            attempt = item.original.retries - env.retries + 1
            event = ev.SENT if error is None else ev.SEND_FAILED
            direction: dict[str, int] = {}
        else:
            attempt = int((item.state or {}).get("attempts", 0)) + 1
            event = ev.REPLY_SENT if error is None else ev.REPLY_FAILED
            # Events name the request's direction; a reply travels the other way.
            direction = {"src": env.dst[0], "dst": env.src}
        self._events.emit(
            event,
            env,
            at=started_at,
            attempt=attempt,
            duration_us=duration_us,
            status=200 if error is None else None,
            error=error.cause if error else None,
            **direction,
        )
