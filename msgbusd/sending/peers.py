"""How a message leaves this site: one :class:`Peer` per destination twin owns everything on the way out.

1. A request a local client pushed, or a service's reply to a peer's request, is accepted by a handler
   (:mod:`msgbusd.door.handlers`) in one script that also appends it to its destination's send queue in Redis,
   then handed to the destination's peer (:meth:`Peers.kick`).
2. The peer's sender reads the head of that queue (or takes what was just accepted straight from memory
   while memory and the queue are known to be in step), stamps and signs each envelope, and sends up to
   :data:`BATCH` of them at once: over the link to a msgbus site (:mod:`msgbusd.link.links`), or in POSTs
   to a site that takes no links (go-rmb, or ``--no-links``; :mod:`msgbusd.sending.posts`). On a link up to
   :data:`WINDOW` batches are on their way at once, each read after the ones before it (from memory or the
   queue); those with requests all on one link, so that one that breaks fails the ones after it too.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from msgbusd.errors import DeliveryError
from msgbusd.identity.sealing import Sealer, SealError
from msgbusd.identity.signing import Signer
from msgbusd.link.links import UPLINK_WAIT_S, Link, Links, send_envelopes
from msgbusd.link.way_back import WayBack, no_way_back
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics
from msgbusd.reports.peer_activity import PeerActivityLog
from msgbusd.sending.health import HealthState, PeerHealth, ProbePace, probe_backoff
from msgbusd.sending.large_messages import LargeMessages
from msgbusd.sending.peer_report import PeerReport
from msgbusd.sending.posts import PostClient
from msgbusd.sending.schedule import Schedule
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.leases import Leases, first_set
from msgbusd.store.queues import Store
from twin_resolver.base import Resolver, ResolverError, Twin
from wire import event_schema as ev
from wire.backoff import REDIS_RECONNECT

log = logging.getLogger("msgbusd.peers")

# Entries sent at once at most.
BATCH = 64
# A sender with nothing to send stops after this long (a new one starts when something comes).
IDLE_STOP_S = 30.0
# While a peer is down, the finished entries (given up, expired) at the head of its queue are dropped this
# often, and after each give-up.
TRIM_EVERY_S = 5.0
# What a sender that is not in step with its queue keeps of the work queued meanwhile, to catch up; and what
# is kept for a destination whose sender has not started yet.
KEPT_WHILE_UNTRUSTED = 4 * BATCH
# What is kept for all the twins waiting for a sender's place together (the others read theirs from Redis).
KEPT_WAITING = 20_000
# A twin sent several messages at once (Peers.link_after), or one again within this long, is worth a link
# (when its site takes links); a single message now and then goes in a POST.
BUSY_WITHIN_S = 10.0
# Batches sent from memory whose answers are awaited at once, at most. The next batch goes when the ones
# before are answered, or once the last one sent has been on its way this long: over a link with a long
# round trip, or behind a large message on a thin one, a batch does not wait for the answer to the one
# before. On a quick link the answer comes first, and what was queued meanwhile goes in one batch; on a thin
# one, fewer and larger frames leave more of the cable to the large message (20 ms: worse tails there).
# A peer that asks to wait (503 or 429 with Retry-After) may have taken the batches sent after the refused
# one: they come again from Redis after the wait, and the peer drops what it already has.
WINDOW = 8
WINDOW_AFTER_S = 0.1

# Peers forgets a peer once it is up and idle: one it no longer holds is up.
UP = HealthState("up")

SpawnTask = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass(eq=False)
class Lane:
    """A running sender's view of its queue.

    ``fresh`` holds what was just queued for the destination, ready to send, while ``trusted`` says it
    mirrors the Redis send queue; then the sender sends from memory and only takes what it sent out of the
    queue (checking the queue started with it). Anything unexpected makes the lane untrusted: it sends from
    Redis again until it has sent the whole queue with nothing unknown queued meanwhile; what was queued
    since (kept in ``fresh``) is then all that is left, and the lane is trusted again.
    """

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    fresh: deque[SendItem] = field(default_factory=deque)
    trusted: bool = False
    # Something not known was queued while untrusted: reading Redis to its end does not prove the lane is
    # in step.
    missed: bool = False
    # Work this instance was not told of may wait in the queue (behind what memory holds): the queue is read
    # once memory is sent.
    recheck: bool = False
    # While the peer is down: how many entries at the head of the queue have their give-up time written.
    noted: int = 0
    # The peer asked us to wait (503 with Retry-After) until this time (monotonic).
    paused_until: float = 0.0
    # While the peer is down: when the first waiting message gives up (None: not read yet), and when the
    # finished entries at the head of the queue were last dropped.
    give_up_at: float | None = None
    trimmed_at: float = -math.inf
    # Idle, and asked to stop: another twin waits for the sender's place.
    give_way: bool = False
    # The entries of the last batch sent from Redis: the word that one of them was queued may come after.
    sent_from_queue: set[str] = field(default_factory=set)

    def distrust(self) -> None:
        self.trusted = False
        self.fresh.clear()

    def queued(self, items: Sequence[SendItem]) -> None:
        """``items`` were just queued: sent from memory unless the Redis path already sent them."""
        self.fresh.extend(item for item in items if item.entry not in self.sent_from_queue)
        if not self.trusted and len(self.fresh) > KEPT_WHILE_UNTRUSTED:
            # Too far behind to catch up from memory: Redis is read until it is empty.
            self.fresh.clear()
            self.missed = True

    def sent_from_redis(self, entries: Sequence[str]) -> None:
        """``entries`` were sent from the Redis queue: memory does not send them again."""
        self.sent_from_queue = set(entries)
        if self.fresh:
            self.fresh = deque(item for item in self.fresh if item.entry not in self.sent_from_queue)

    def caught_up(self) -> None:
        """The whole queue was sent from Redis, and all that was queued since is known: what is left to
        send is what memory holds."""
        self.trusted = True


@dataclass
class Kept:
    """What was queued for a destination whose sender has not started (its lease is being claimed, or it
    waits for a sender's place), in order; None: not all of it is known. ``alone``: its send queue held
    nothing before that."""

    items: list[SendItem] | None
    alone: bool
    # As Lane.recheck.
    recheck: bool = False

    @classmethod
    def of(cls, items: Sequence[SendItem] | None, alone: bool) -> Kept:
        return cls(list(items) if items else None, alone and bool(items))

    def add(self, items: Sequence[SendItem] | None) -> int:
        """Keep ``items`` too (queued after the others); returns how many more are kept."""
        kept = self.items
        if kept is None:
            return 0
        if items is None or len(kept) + len(items) > KEPT_WHILE_UNTRUSTED:
            self.items, self.alone = None, False
            return -len(kept)
        kept.extend(items)
        return len(items)

    def __len__(self) -> int:
        return len(self.items) if self.items else 0


class Peer:
    """One destination twin: its health, its sender over its send queue, and how envelopes reach it."""

    def __init__(self, twin: int, peers: Peers) -> None:
        self.twin = twin
        self.health = PeerHealth(peers.probes, pace=peers.probe_pace)
        # The running sender's lane; None while no sender runs.
        self.lane: Lane | None = None
        self._peers = peers
        self._schedule = peers.schedule
        self._store = peers.store
        # When something was last sent to the twin (monotonic).
        self._sent_at = -math.inf
        # The running sender holds one of the site's sender places for peers that answer.
        self.has_place = False
        # Set when the twin's uplink to this site opens: a sender waiting for it stops waiting.
        self.uplink_opened = asyncio.Event()
        # Set when the lease of sending to the twin goes to another instance of the site: a sender pausing
        # stops pausing (and then stops).
        self.lease_going = asyncio.Event()
        # Waiting for the twin to open its uplink (said once in the log).
        self.waits_for_uplink = False
        # That messages wait for the twin while it is down is in the log.
        self.holding_said = True
        # Large messages sent beside the others.
        self.large = LargeMessages(peers.large_message_bytes)
        # Batches sent from memory, oldest first, each awaiting its answers (True: all of it went, and is
        # out of the queue); when the last one was sent (monotonic); the Redis error one of them met.
        self._window: deque[asyncio.Task[bool]] = deque()
        self._window_sent_at = -math.inf
        self._window_error: RedisError | OSError | None = None
        # Each batch on its way: the link it went on (None: in POSTs), whether it carries requests, and the
        # send queue's entries it takes out.
        self._window_on: dict[asyncio.Task[bool], tuple[Link | None, bool, list[str]]] = {}
        # The link the batch being written went on.
        self._window_link: Link | None = None

    # --- the sender --------------------------------------------------------------------------------------

    async def run(self, lane: Lane) -> None:
        """Send until the queue is empty (and stays so a while), the lease of this destination goes to
        another instance of the site, or the daemon stops."""
        leases = self._peers.leases
        self.lease_going.clear()
        with leases.using(str(self.twin)) if leases is not None else contextlib.nullcontext():
            await self._run(lane)

    async def _run(self, lane: Lane) -> None:
        redis_failures = 0
        try:
            while not self._peers.stopping.is_set():
                lane.wake.clear()
                try:
                    if not await self._step(lane):
                        return
                    redis_failures = 0
                except (RedisError, OSError) as exc:
                    # The queue is in Redis: nothing is lost, the sender just waits for Redis to be back.
                    lane.distrust()
                    redis_failures += 1
                    delay = REDIS_RECONNECT.delay_s(redis_failures)
                    self._peers.metrics.error("redis")
                    log.warning(
                        "sender to twin %s: redis failed (%s); again in %.1fs",
                        self.twin,
                        exc,
                        delay,
                        extra=about(dst=self.twin),
                    )
                    await self._pause(delay)
        finally:
            await self._end_window()
            self._peers.stopped(self, lane)

    async def _step(self, lane: Lane) -> bool:
        """One turn of the sender; False when it should stop (idle long enough, nothing left, or the lease
        gone)."""
        if not self._peers.holds(self.twin):
            return False
        ready = not self.health.is_down and lane.paused_until <= time.monotonic()
        from_memory = lane.trusted and (bool(lane.fresh) or not lane.recheck)
        from_queue = not lane.trusted and not lane.recheck and not self.large.entries
        waited_for = self._window or self._window_error is not None
        if waited_for and not (ready and (from_memory or from_queue)):
            # Anything but more from memory or from the queue, or waiting for it, starts from what the
            # batches on their way end with.
            await self._drain_window()
            return True
        if self.health.is_down:
            return await self._while_down(lane)
        if lane.paused_until > time.monotonic():
            lane.distrust()
            if await self._pause(lane.paused_until - time.monotonic()):
                lane.paused_until = 0.0
            return True
        if lane.trusted and lane.fresh:
            await self._send_fresh(lane)
        elif lane.recheck:
            lane.recheck = False
            lane.distrust()
        elif not lane.trusted:
            lane.missed = False
            if self.large.entries:
                async with self._peers.turns:
                    all_sent = await self._send_some(lane)
            else:
                all_sent = await self._read_ahead(lane)
            if all_sent and not lane.missed:
                lane.caught_up()
        else:
            return await self._idle(lane)
        return True

    async def _idle(self, lane: Lane) -> bool:
        """Wait for more to send; False once the lane has been idle long enough, or the daemon stops."""
        peers = self._peers
        if peers.place_wanted and not self.large.busy:
            return False
        # Woken by work, by a twin that wants the place, or by the daemon stopping (Peers sets the wake).
        try:
            with peers.idling(lane), contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_STOP_S):
                    await lane.wake.wait()
            if peers.stopping.is_set():
                return False
            has_work = bool(lane.fresh) or not lane.trusted or lane.recheck or self.large.busy
            return has_work or (lane.wake.is_set() and not lane.give_way)
        finally:
            lane.give_way = False

    async def _send_fresh(self, lane: Lane) -> None:
        """Send what was just queued straight from memory, beside the batches still awaiting their
        answers; the Redis queue is popped, not read."""
        if not await self._window_has_room():
            return
        items = self._set_aside([lane.fresh.popleft() for _ in range(min(BATCH, len(lane.fresh)))])
        if items:
            await self._start_batch(lane, items, [item.entry for item in items])

    async def _read_ahead(self, lane: Lane) -> bool:
        """Send the next batch of the Redis queue, the one after the batches on their way, beside them (as
        :meth:`_send_fresh` does from memory: a backlog crosses a long round trip several batches at a
        time); True when that was the rest of the queue."""
        if not await self._window_has_room():
            return False
        on_their_way = [entry for batch in self._window for entry in self._window_on[batch][2]]
        known = set(on_their_way)
        items: list[SendItem] = []
        async with self._peers.turns:
            read = await self._store.send_queue_heads(self.twin, len(on_their_way) + BATCH)
            # Those on their way still in the queue lead it (they leave it from the head, in order).
            ahead = 0
            while ahead < len(read) and read[ahead] in known:
                ahead += 1
            entries = read[ahead : ahead + BATCH]
            in_step = not any(entry in known for entry in read[ahead:])
            if entries and in_step:
                self._peers.metrics.send_queue_read()
                items = await self._peers.items.read(entries)
        if not in_step:
            # The queue changed otherwise (another instance's word was late): read again from the head once
            # the batches on their way are settled.
            await self._drain_window()
            return False
        whole = len(read) < len(on_their_way) + BATCH and len(read) - ahead <= BATCH
        if not entries:
            return whole
        lane.sent_from_redis([*on_their_way, *entries])
        batch = self._set_aside(items)
        if len(batch) < len(items):
            taken = {item.entry for item in batch}
            set_aside = {item.entry for item in items if item.entry not in taken}
            entries = [entry for entry in entries if entry not in set_aside]
        await self._start_batch(lane, batch, entries)
        return whole

    async def _window_has_room(self) -> bool:
        """Whether another batch may leave now, beside the ones on their way; if not, wait until one of them
        is answered or the pace allows another (the step looks again after). A batch that did not all go
        ends the window (raising what it failed with)."""
        window = self._window
        while window and window[0].done():
            self._window_on.pop(window[0], None)
            batch = window.popleft()
            if not _succeeded(batch):
                await self._drain_window()
                _raise_failure(batch)
                return False
        if self._window_error is not None:
            await self._drain_window()
            return False
        if window:
            wait_s = self._window_sent_at + WINDOW_AFTER_S - time.monotonic()
            if len(window) >= WINDOW or wait_s > 0:
                # What comes meanwhile goes in the same batch.
                timeout = None if len(window) >= WINDOW else wait_s
                await asyncio.wait(window, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                return False
        return True

    async def _start_batch(self, lane: Lane, items: list[SendItem], entries: list[str]) -> None:
        """Send ``items`` (the send queue's ``entries``, in order; an entry without an item is finished) in a
        batch of the window; returns once it is written."""
        written = asyncio.Event()
        window = self._window
        before = window[-1] if window else None
        has_requests = any(item.is_request for item in items)
        beside = self._link_beside(has_requests) if before is not None else None
        batch = asyncio.ensure_future(self._send_batch(lane, items, entries, before, beside, written))
        batch.add_done_callback(lambda _: written.set())
        window.append(batch)
        self._window_on[batch] = (None, True, entries)
        self._window_sent_at = time.monotonic()
        # The next batch is written after this one.
        await written.wait()
        self._window_on[batch] = (self._window_link, has_requests, entries)

    def _link_beside(self, has_requests: bool) -> Link | None:
        """The link a batch can go on now, beside the batches on their way, if any: an open one, the
        same as the one each batch on its way with requests went on when it has requests (a
        broken link fails both, and both come again from the queue in order; what one peer's requests and
        replies carry is not ordered across them), and none once a batch before did not all go."""
        links = self._peers.links
        if links is None:
            return None
        link = links.current(self.twin, replies_only=not has_requests)
        if link is None:
            return None
        for batch in self._window:
            if batch.done():
                if not _succeeded(batch):
                    return None
                continue
            on, with_requests, _ = self._window_on[batch]
            if on is None or not on.is_open or (has_requests and with_requests and on is not link):
                return None
        return link

    async def _send_batch(
        self,
        lane: Lane,
        items: list[SendItem],
        entries: list[str],
        before: asyncio.Task[bool] | None,
        beside: Link | None,
        written: asyncio.Event,
    ) -> bool:
        """Send a batch; once the batches before it are out of the queue, take it (``entries``) out too.
        True when all of it went and the queue began with it; otherwise the lane sends from Redis again
        (the peer drops what it already has)."""
        try:
            if before is not None and beside is None and not await before:
                # Sent after the batches before are settled, and only if they all went: otherwise it would
                # arrive before what they leave in the queue.
                lane.distrust()
                return False
            if items:
                async with self._peers.turns:
                    done, replies = await self._deliver(lane, entries, items, written, beside)
            else:
                done, replies = len(entries), []
            written.set()
            if before is not None and not await before:
                lane.distrust()
                return False
            if done == len(entries):
                if await self._store.sent(self.twin, replies, exact=entries, ahead=self.large.entries):
                    return True
                # The queue held more than memory, or in another order (several instances queue for one
                # destination; the word of one may be late): what was sent is out of it, the Redis path
                # sends the rest.
                lane.distrust()
                return False
            # Held messages: pop only what is certainly dealt with, and let the Redis path send the rest.
            lane.distrust()
            await self._store.sent(self.twin, replies, exact=entries[:done], ahead=self.large.entries)
            return False
        except (RedisError, OSError) as exc:
            lane.distrust()
            self._window_error = self._window_error or exc
            return False
        finally:
            if not lane.trusted:
                lane.wake.set()

    async def _drain_window(self) -> None:
        """Wait for the batches on their way; raises the Redis error one of them met."""
        window, self._window = self._window, deque()
        self._window_on.clear()
        if window:
            await asyncio.wait(window)
        error, self._window_error = self._window_error, None
        for batch in window:
            _raise_failure(batch)
        if error is not None:
            raise error

    async def _end_window(self) -> None:
        """The sender ends: its batches on their way end first (with it, when it is cancelled)."""
        window, self._window = self._window, deque()
        self._window_on.clear()
        self._window_error = None
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            for batch in window:
                batch.cancel()
        elif window:
            await asyncio.wait(window)
            for batch in window:
                if not batch.cancelled() and (exc := batch.exception()) is not None:
                    log.error("sending to twin %s failed: %r", self.twin, exc, extra=about(dst=self.twin))

    async def _send_some(self, lane: Lane) -> bool:
        """Send the next batch of the queue; True when that was the whole queue, and all of it went."""
        aside = len(self.large.entries)
        entries = await self._store.send_queue_heads(self.twin, BATCH + aside)
        if not entries:
            return True
        whole = len(entries) < BATCH + aside
        if aside:
            # Large messages on their way stay where they are; the sender reads around them.
            around = [entry for entry in entries if entry not in self.large]
            whole = whole and len(around) <= BATCH
            entries = around[:BATCH]
            if not entries:
                return whole
        self._peers.metrics.send_queue_read()
        items = await self._peers.items.read(entries)
        batch = self._set_aside(items)
        if len(batch) < len(items) or aside:
            taken = {item.entry for item in batch}
            set_aside = [item.entry for item in items if item.entry not in taken]
            entries = [entry for entry in entries if entry not in set_aside]
            done, replies = await self._deliver(lane, entries, batch) if batch else (len(entries), [])
            await self._store.sent(self.twin, replies, exact=entries[:done], ahead=self.large.entries)
            lane.sent_from_redis([*entries[:done], *set_aside])
            return whole and done == len(entries)
        done, replies = await self._deliver(lane, entries, items) if items else (len(entries), [])
        await self._store.sent(self.twin, replies, head=(entries[0], done))
        lane.sent_from_redis(entries[:done])
        return whole and done == len(entries)

    # --- large messages, sent beside the others -------------------------------------------------------------

    def _set_aside(self, items: list[SendItem]) -> list[SendItem]:
        """Start sending the large messages among ``items`` on their own (or keep them waiting for a slot);
        returns the others, to send as a batch."""
        if self.large.threshold_bytes <= 0:
            return items
        batch, start = self.large.set_aside(items)
        for item in start:
            self._peers.spawn(self._send_large(item), f"large message {item.entry} to twin {self.twin}")
        return batch

    async def _send_large(self, item: SendItem) -> None:
        """Send one large message; its entry leaves the send queue once the peer has it (or its failure is
        in the schedule). Then the next waiting one goes."""
        delivered = False
        following: str | None = None
        try:
            done, replies = await self._deliver(self.lane or Lane(), [item.entry], [item])
            await self._store.sent(self.twin, replies, remove=[item.entry][:done])
            delivered = done == 1
        except (RedisError, OSError) as exc:
            log.warning(
                "sending %s to twin %s: redis failed (%s); it is sent again from the queue",
                item.entry,
                self.twin,
                exc,
                extra=about(dst=self.twin),
            )
        finally:
            following = self.large.finished(item.entry, delivered=delivered)
            if not delivered and self.lane is not None:
                # It waits in the queue, where the sender reads it again.
                self.lane.distrust()
                self.lane.wake.set()
        if following is not None:
            what = f"large message {following} to twin {self.twin}"
            self._peers.spawn(self._send_waiting_large(following), what)

    async def _send_waiting_large(self, entry: str | None) -> None:
        """Read a large message that waited for its slot, and send it."""
        while entry is not None:
            try:
                items = await self._peers.items.read([entry])
            except (RedisError, OSError):
                self.large.finished(entry, delivered=False)
                if self.lane is not None:
                    self.lane.distrust()
                    self.lane.wake.set()
                return
            if items:
                await self._send_large(items[0])
                return
            # Finished meanwhile (given up, expired): out of the queue, and the next one goes.
            with contextlib.suppress(RedisError, OSError):
                await self._store.sent(self.twin, [], remove=[entry])
            entry = self.large.finished(entry, delivered=True)

    async def _deliver(
        self,
        lane: Lane,
        entries: list[str],
        items: list[SendItem],
        written: asyncio.Event | None = None,
        link: Link | None = None,
    ) -> tuple[int, list[str]]:
        """Send ``items`` (on ``link`` when given); returns how many leading entries are dealt with (the rest
        wait in the queue), and the keys of the replies the peer took (to forget). ``written``: set once
        they are on a link."""
        results = await self._send(items, written, link)
        taken = [it for it, error in zip(items, results, strict=True) if error is None]
        replies = self._peers.count_sent(taken)
        self._note(results, any_taken=bool(taken))
        for index, (item, error) in enumerate(zip(items, results, strict=True)):
            if error is None:
                continue
            if error.waits_for_uplink:
                self._wait_for_uplink(lane, error)
                return entries.index(item.entry), replies
            if error.retry_after_s is not None:
                log.info(
                    "twin %s cannot take messages now (%s); sending again in %.1fs",
                    self.twin,
                    error.cause,
                    error.retry_after_s,
                    extra=about(dst=self.twin),
                )
                lane.paused_until = time.monotonic() + error.retry_after_s
                return entries.index(item.entry), replies
            if error.offline:
                self._went_down(error)
                dealt_with = entries.index(item.entry)
                if not self._schedule.hold_offline:
                    attempted = [
                        it for it, e in zip(items[index:], results[index:], strict=True) if e and e.attempted
                    ]
                    finished = await self._schedule.failed_while_offline(attempted, error.cause)
                    # Those that failed for good leave the queue with what went, not in a later trim.
                    while dealt_with < len(entries) and entries[dealt_with] in finished:
                        dealt_with += 1
                return dealt_with, replies
            await self._schedule.refused(item, error.cause, final=error.final)
        return len(entries), replies

    # --- the wire ----------------------------------------------------------------------------------------

    async def _send(
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

    def _note(self, results: list[DeliveryError | None], *, any_taken: bool) -> None:
        activity = self._peers.activity
        if any_taken:
            activity.sent(self.twin)
        failures = [error for error in results if error is not None]
        if failures:
            activity.failed(self.twin, failures[-1].cause)

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
                link = await links.link_to(self.twin, replies_only=replies_only, open_new=busy)
            except DeliveryError as exc:
                return [exc] * len(items)
        if written is not None:
            self._window_link = link
        if link is None and not replies_only and await self._answered_only_over_links():
            return await self._without_way_back(items, lone=lone)
        # Through a relay (a link to another twin, or POSTs to the twin's relay), payloads are encrypted for
        # the twin.
        seal_for = None
        if link is None or link.peer != self.twin:
            seal_for = await self._peers.relayed_twin(self.twin)
        try:
            signed = [(item.path, self._peers.sign(item, seal_for)) for item in items]
        except SealError as exc:
            # Nothing can go to the twin through its relay until its twin entry says how to encrypt for it.
            return [DeliveryError(str(exc), kind="refused", final=True)] * len(items)
        if link is not None:
            started = time.perf_counter()
            results = await send_envelopes(link, signed, self._peers.links_timeout_s, written)
            self._peers.metrics.observe_send("link", time.perf_counter() - started)
            if links is not None and not replies_only and link.peer == self.twin:
                links.expect_answers(self.twin, _answers_within_s(items))
            return results
        results = await self._peers.posts.send_many(self.twin, signed, keep_alive=not lone)
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
            link = await links.link_to(self.twin, replies_only=replies_only, open_new=True)
        except DeliveryError:
            return results
        if link is None or link.peer != self.twin:
            return results
        again = [index for index, result in enumerate(results) if result is not None and result.clock_off]
        signed = [(items[index].path, self._peers.sign(items[index], None)) for index in again]
        sent = await send_envelopes(link, signed, self._peers.links_timeout_s)
        if not replies_only:
            links.expect_answers(self.twin, _answers_within_s([items[index] for index in again]))
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
        refusal = no_way_back(way_back.twin, self.twin, links_off=self._peers.links is None)
        results: list[DeliveryError | None] = [refusal if item.is_request else None for item in items]
        replies = [item for item in items if not item.is_request]
        if replies:
            seal_for = await self._peers.relayed_twin(self.twin)
            try:
                signed = [(item.path, self._peers.sign(item, seal_for)) for item in replies]
            except SealError as exc:
                signed, sealing = [], DeliveryError(str(exc), kind="refused", final=True)
                results = [sealing if result is None else result for result in results]
            if signed:
                sent = iter(await self._peers.posts.send_many(self.twin, signed, keep_alive=not lone))
                results = [next(sent) if result is None else result for result in results]
        return results

    # --- a peer that is down -----------------------------------------------------------------------------

    async def _while_down(self, lane: Lane) -> bool:
        """Wait for the next probe and make it; while the peer stays down, give up what waited long enough
        (when its time comes, not at the next probe: with many peers down, probes are far apart). False
        once nothing is left waiting for the peer, and nothing was queued for it meanwhile."""
        lane.distrust()
        lane.missed = False
        if await self._down_step(lane):
            return True
        # Work queued while the step found the queue empty: the sender goes on rather than leave it unsent.
        return bool(lane.fresh) or lane.missed

    async def _down_step(self, lane: Lane) -> bool:
        if lane.give_up_at is None:
            async with self._peers.turns:
                if not await self._settle(lane, probed=False):
                    return False
        assert lane.give_up_at is not None
        await self._pause(min(self.health.seconds_until_probe(), lane.give_up_at - self._peers.clock()))
        if self._peers.stopping.is_set():
            return False
        if self.health.seconds_until_probe() > 0:
            async with self._peers.turns:
                return await self._settle(lane, probed=False)
        # Probes have turns of their own: a probe of a site that swallows packets waits out its timeout, and
        # peers that are down must not hold back the sends to the others.
        async with self._peers.probe_turns:
            error = await self._probe()
            self._peers.metrics.message("probed")
        if error is not None:
            self._peers.activity.failed(self.twin, error.cause)
        if error is not None and error.retry_after_s is not None:
            # Up, but its Redis is away: no attempt failed, nothing gives up.
            self.health.busy(error.retry_after_s)
            return True
        async with self._peers.turns:
            if error is None:
                await self._back(lane)
                return True
            self._went_down(error)
            return await self._settle(lane, probed=True)

    async def _probe(self) -> DeliveryError | None:
        """Whether the peer answers (None) or why not; a twin reached over its uplink answers once its
        uplink is open."""
        links = self._peers.links
        if links is not None and await links.reached_by_uplink(self.twin):
            if links.current_uplink(self.twin) is not None:
                return None
            return DeliveryError(
                f"twin {self.twin} is reached over the uplink it opens to this site, and none is open",
                retry_after_s=UPLINK_WAIT_S,
                attempted=False,
                waits_for_uplink=True,
            )
        return await self._peers.posts.probe(self.twin)

    def _wait_for_uplink(self, lane: Lane, error: DeliveryError) -> None:
        """Nothing is sent to the twin until its uplink opens (or a while has passed); no attempt is spent
        meanwhile, and the sender gives its place to others."""
        if not self.waits_for_uplink:
            self.waits_for_uplink = True
            log.info("holding messages to twin %s: %s", self.twin, error.cause, extra=about(dst=self.twin))
        self._peers.activity.failed(self.twin, error.cause)
        self._peers.leave_place(self)
        lane.paused_until = time.monotonic() + (error.retry_after_s or UPLINK_WAIT_S)

    async def _settle(self, lane: Lane, *, probed: bool) -> bool:
        """The bookkeeping of a peer that stays down, in as few round trips as what changed needs: after a
        failed probe, write the give-up times of what was queued since the last one; give up (a bounded
        number of) the messages whose time has come; drop the finished ones at the head of the queue now and
        then. False once nothing is left waiting."""
        schedule, twin = self._schedule, self.twin
        waiting = await self._store.send_queue_length(twin)
        if not waiting:
            # Nothing waits (what failed for good left with the send): no give-up time is due or next.
            if lane.give_up_at is not None or lane.noted:
                await schedule.forget(twin)
                lane.noted, lane.give_up_at = 0, None
            return False
        if probed and lane.noted < waiting:
            lane.noted, first = await schedule.note(twin, lane.noted)
            if lane.give_up_at is not None:
                lane.give_up_at = min(lane.give_up_at, first)
        now = self._peers.clock()
        gave_up = 0
        if lane.give_up_at is None or lane.give_up_at <= now:
            gave_up = await schedule.give_up_due(twin, f"twin {twin} is unreachable ({self.health.cause})")
            lane.give_up_at = await schedule.next_give_up_at(twin)
        if gave_up or now - lane.trimmed_at >= TRIM_EVERY_S:
            trimmed = await schedule.trim(twin, BATCH)
            lane.noted, waiting, lane.trimmed_at = max(0, lane.noted - trimmed), waiting - trimmed, now
        if waiting > 0:
            self._say_holding(waiting)
        return waiting > 0

    async def _back(self, lane: Lane) -> None:
        down_s = self.health.answered()
        await self._schedule.forget(self.twin)
        lane.noted, lane.give_up_at = 0, None
        if down_s is not None:
            log.warning(
                "twin %s answers again after %.1fs; sending the %d message(s) waiting for it",
                self.twin,
                down_s,
                await self._store.send_queue_length(self.twin),
                extra=about(dst=self.twin),
            )

    def _went_down(self, error: DeliveryError) -> None:
        self._peers.leave_place(self)
        if self.health.unreachable(error.cause):
            self.holding_said = False

    def _say_holding(self, waiting: int) -> None:
        """Say once per time down that messages wait for the twin (not when what found it down failed for
        good and nothing waits: its callers have their errors, and the log has each)."""
        if not self.holding_said and self.health.is_down:
            self.holding_said = True
            log.warning(
                "holding messages to twin %s while it is unreachable: %s; probing it every second or two "
                "(%d waiting)",
                self.twin,
                self.health.cause,
                waiting,
                extra=about(dst=self.twin),
            )

    async def _pause(self, delay_s: float) -> bool:
        """Wait ``delay_s``, or until the daemon stops, the lease goes or the twin's uplink opens; True in
        the last case."""
        if not self.uplink_opened.is_set() and not self.lease_going.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay_s, 0.01)):
                    await first_set(self._peers.stopping, self.uplink_opened, self.lease_going)
        if self.lease_going.is_set():
            self.lease_going.clear()
            return False
        if not self.uplink_opened.is_set():
            return False
        self.uplink_opened.clear()
        if self.waits_for_uplink:
            self.waits_for_uplink = False
            log.info("twin %s's uplink is open; sending what waited", self.twin, extra=about(dst=self.twin))
        return True


def _succeeded(batch: asyncio.Task[bool]) -> bool:
    """A batch sent beside the sender all went (and is out of the queue)."""
    return not batch.cancelled() and batch.exception() is None and batch.result()


def _raise_failure(batch: asyncio.Task[bool]) -> None:
    """Raise what a batch sent beside the sender failed with (it handles Redis and socket errors itself)."""
    if not batch.cancelled() and (exc := batch.exception()) is not None:
        raise exc


def _answers_within_s(items: Sequence[SendItem]) -> float:
    """How long answers to the requests among ``items`` may still come (their lifetimes)."""
    return max((float(item.envelope.lifetime_s) for item in items if item.is_request), default=0.0)


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
        self._idle_lanes: set[Lane] = set()
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
        within bounds), and idle senders are asked to stop."""
        if self._free_places > 0 and not self._waiting:
            self._free_places -= 1
            return True
        if dst in self._waiting:
            self._kept_waiting += self._waiting[dst].add(items)
        else:
            kept = self._waiting[dst] = Kept.of(items if self._kept_waiting < KEPT_WAITING else None, alone)
            self._kept_waiting += len(kept)
        for lane in self._idle_lanes:
            lane.give_way = True
            lane.wake.set()
        return False

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
        self._idle_lanes.add(lane)
        try:
            yield
        finally:
            self._idle_lanes.discard(lane)

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
