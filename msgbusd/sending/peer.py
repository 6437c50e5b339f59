"""One destination twin's peer: its health, and its sender, which sends the twin's send queue in order until
the queue has been empty a while (steps 2 to 5 of :mod:`msgbusd.sending.peers`).

Each turn the sender sends what was just queued straight from memory while its lane says memory and the
queue are in step (:mod:`msgbusd.sending.lanes`), or else the next batch of the queue, read from Redis.
Several batches are on their way at once (:mod:`msgbusd.sending.batch_window`), large messages go on their
own beside them (:mod:`msgbusd.sending.large_sends`), and every message is stamped, signed and sent over the
link or in POSTs (:mod:`msgbusd.sending.transmit`). Every envelope gets its own answer: a refusal is the
message's own failure, counted by the schedule (:mod:`msgbusd.sending.schedule`); a peer that asks to wait
(503 with ``Retry-After``) is sent nothing for that long, which costs no try; no answer at all is the peer's
failure (:mod:`msgbusd.sending.health`). A peer that is down is sent nothing but a probe every second or
two while its messages wait in the queue, and those whose tries or lifetime run out are given up when their
time comes, not at the next probe; the first probe that gets an answer lets the whole queue flow again. A
twin reached over the uplink it opens to this site is sent nothing until the uplink is open, which costs no
try either. A Redis error loses nothing: the queue is in Redis, and the sender waits for it to be back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextlib import AbstractContextManager
from typing import Protocol

from redis.exceptions import RedisError

from msgbusd.errors import DeliveryError
from msgbusd.link.open_link import Link
from msgbusd.link.uplinks import UPLINK_WAIT_S
from msgbusd.reports.logs import about
from msgbusd.sending import large_sends
from msgbusd.sending.batch_window import BatchWindow
from msgbusd.sending.health import PeerHealth
from msgbusd.sending.lanes import BATCH, Lane
from msgbusd.sending.large_messages import LargeMessages
from msgbusd.sending.send_items import SendItem
from msgbusd.sending.senders import Senders
from msgbusd.sending.transmit import Transmitter
from msgbusd.store.leases import first_set
from wire.backoff import REDIS_RECONNECT

log = logging.getLogger("msgbusd.peers")

# A sender with nothing to send stops after this long (a new one starts when something comes).
IDLE_STOP_S = 30.0
# While a peer is down, the finished entries (given up, expired) at the head of its queue are dropped this
# often, and after each give-up.
TRIM_EVERY_S = 5.0


class SenderPlaces(Senders, Protocol):
    """The site's peers, as a peer's sender sees them: what all senders share, and the sender places they
    take and give back (:class:`msgbusd.sending.peers.Peers`)."""

    @property
    def place_wanted(self) -> bool: ...

    def idling(self, lane: Lane) -> AbstractContextManager[None]: ...

    def make_room(self) -> None: ...

    def leave_place(self, peer: Peer) -> None: ...

    def stopped(self, peer: Peer, lane: Lane) -> None: ...


class Peer:
    """One destination twin: its health, its sender over its send queue, and how envelopes reach it."""

    def __init__(self, twin: int, peers: SenderPlaces) -> None:
        self.twin = twin
        self.health = PeerHealth(peers.probes, pace=peers.probe_pace)
        # The running sender's lane; None while no sender runs.
        self.lane: Lane | None = None
        self.peers = peers
        self._schedule = peers.schedule
        self._store = peers.store
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
        # The parts it sends with refer to what the peer refers to, never to the peer itself: a peer forgotten
        # is freed at once, with no cycle left for the collector (see msgbusd.site.garbage).
        # Batches sent from memory, each awaiting its answers, beside the sender.
        self._window = BatchWindow(twin, peers, self.large)
        # How what it sends reaches the twin: over its link, else in POSTs.
        self._transmitter = Transmitter(twin, peers, self._window)

    # --- the sender --------------------------------------------------------------------------------------

    async def run(self, lane: Lane) -> None:
        """Send until the queue is empty (and stays so a while), the lease of this destination goes to
        another instance of the site, or the daemon stops."""
        leases = self.peers.leases
        self.lease_going.clear()
        with leases.using(str(self.twin)) if leases is not None else contextlib.nullcontext():
            await self._run(lane)

    async def _run(self, lane: Lane) -> None:
        redis_failures = 0
        try:
            while not self.peers.stopping.is_set():
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
                    self.peers.metrics.error("redis")
                    log.warning(
                        "sender to twin %s: redis failed (%s); again in %.1fs",
                        self.twin,
                        exc,
                        delay,
                        extra=about(dst=self.twin),
                    )
                    await self._pause(delay)
        finally:
            await self._window.end()
            self.peers.stopped(self, lane)

    async def _step(self, lane: Lane) -> bool:
        """One turn of the sender; False when it should stop (idle long enough, nothing left, or the lease
        gone)."""
        if not self.peers.holds(self.twin):
            return False
        ready = not self.health.is_down and lane.paused_until <= time.monotonic()
        from_memory = lane.trusted and (bool(lane.fresh) or not lane.recheck)
        from_queue = not lane.trusted and not lane.recheck and not self.large.entries
        waited_for = self._window.waited_for
        if waited_for and not (ready and (from_memory or from_queue)):
            # Anything but more from memory or from the queue, or waiting for it, starts from what the
            # batches on their way end with.
            await self._window.drain()
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
                async with self.peers.turns:
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
        peers = self.peers
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
            if has_work and lane.give_way:
                # Asked to make room, but work came meanwhile: the next idle sender is asked instead.
                peers.make_room()
            return has_work or (lane.wake.is_set() and not lane.give_way)
        finally:
            lane.give_way = False

    async def _send_fresh(self, lane: Lane) -> None:
        """Send what was just queued straight from memory, beside the batches still awaiting their
        answers; the Redis queue is popped, not read."""
        if not await self._window.has_room():
            return
        items = large_sends.set_aside(
            self, [lane.fresh.popleft() for _ in range(min(BATCH, len(lane.fresh)))]
        )
        if items:
            await self._window.start(lane, items, [item.entry for item in items], self.deliver)

    async def _read_ahead(self, lane: Lane) -> bool:
        """Send the next batch of the Redis queue, the one after the batches on their way, beside them (as
        :meth:`_send_fresh` does from memory: a backlog crosses a long round trip several batches at a
        time); True when that was the rest of the queue."""
        if not await self._window.has_room():
            return False
        on_their_way = self._window.entries_on_their_way()
        known = set(on_their_way)
        items: list[SendItem] = []
        async with self.peers.turns:
            read = await self._store.send_queue_heads(self.twin, len(on_their_way) + BATCH)
            # Those on their way still in the queue lead it (they leave it from the head, in order).
            ahead = 0
            while ahead < len(read) and read[ahead] in known:
                ahead += 1
            entries = read[ahead : ahead + BATCH]
            in_step = not any(entry in known for entry in read[ahead:])
            if entries and in_step:
                self.peers.metrics.send_queue_read()
                items = await self.peers.items.read(entries)
        if not in_step:
            # The queue changed otherwise (another instance's word was late): read again from the head once
            # the batches on their way are settled.
            await self._window.drain()
            return False
        whole = len(read) < len(on_their_way) + BATCH and len(read) - ahead <= BATCH
        if not entries:
            return whole
        lane.sent_from_redis([*on_their_way, *entries])
        batch = large_sends.set_aside(self, items)
        if len(batch) < len(items):
            taken = {item.entry for item in batch}
            set_aside = {item.entry for item in items if item.entry not in taken}
            entries = [entry for entry in entries if entry not in set_aside]
        await self._window.start(lane, batch, entries, self.deliver)
        return whole

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
        self.peers.metrics.send_queue_read()
        items = await self.peers.items.read(entries)
        batch = large_sends.set_aside(self, items)
        if len(batch) < len(items) or aside:
            taken = {item.entry for item in batch}
            set_aside = [item.entry for item in items if item.entry not in taken]
            entries = [entry for entry in entries if entry not in set_aside]
            done, replies = await self.deliver(lane, entries, batch) if batch else (len(entries), [])
            await self._store.sent(self.twin, replies, exact=entries[:done], ahead=self.large.entries)
            lane.sent_from_redis([*entries[:done], *set_aside])
            return whole and done == len(entries)
        done, replies = await self.deliver(lane, entries, items) if items else (len(entries), [])
        await self._store.sent(self.twin, replies, head=(entries[0], done))
        lane.sent_from_redis(entries[:done])
        return whole and done == len(entries)

    async def deliver(
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
        results = await self._transmitter.send(items, written, link)
        taken = [it for it, error in zip(items, results, strict=True) if error is None]
        replies = self.peers.count_sent(taken)
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

    def _note(self, results: list[DeliveryError | None], *, any_taken: bool) -> None:
        activity = self.peers.activity
        if any_taken:
            activity.sent(self.twin)
        failures = [error for error in results if error is not None]
        if failures:
            activity.failed(self.twin, failures[-1].cause)

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
            async with self.peers.turns:
                if not await self._settle(lane, probed=False):
                    return False
        assert lane.give_up_at is not None
        await self._pause(min(self.health.seconds_until_probe(), lane.give_up_at - self.peers.clock()))
        if self.peers.stopping.is_set():
            return False
        if self.health.seconds_until_probe() > 0:
            async with self.peers.turns:
                return await self._settle(lane, probed=False)
        # Probes have turns of their own: a probe of a site that swallows packets waits out its timeout, and
        # peers that are down must not hold back the sends to the others.
        async with self.peers.probe_turns:
            error = await self._probe()
            self.peers.metrics.message("probed")
        if error is not None:
            self.peers.activity.failed(self.twin, error.cause)
        if error is not None and error.retry_after_s is not None:
            # Up, but its Redis is away: no attempt failed, nothing gives up.
            self.health.busy(error.retry_after_s)
            return True
        async with self.peers.turns:
            if error is None:
                await self._back(lane)
                return True
            self._went_down(error)
            return await self._settle(lane, probed=True)

    async def _probe(self) -> DeliveryError | None:
        """Whether the peer answers (None) or why not; a twin reached over its uplink answers once its
        uplink is open."""
        links = self.peers.links
        if links is not None and await links.reached_by_uplink(self.twin):
            if links.current_uplink(self.twin) is not None:
                return None
            return DeliveryError(
                f"twin {self.twin} is reached over the uplink it opens to this site, and none is open",
                retry_after_s=UPLINK_WAIT_S,
                attempted=False,
                waits_for_uplink=True,
            )
        return await self.peers.posts.probe(self.twin)

    def _wait_for_uplink(self, lane: Lane, error: DeliveryError) -> None:
        """Nothing is sent to the twin until its uplink opens (or a while has passed); no attempt is spent
        meanwhile, and the sender gives its place to others."""
        if not self.waits_for_uplink:
            self.waits_for_uplink = True
            log.info("holding messages to twin %s: %s", self.twin, error.cause, extra=about(dst=self.twin))
        self.peers.activity.failed(self.twin, error.cause)
        self.peers.leave_place(self)
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
        now = self.peers.clock()
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
        self.peers.leave_place(self)
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
                    await first_set(self.peers.stopping, self.uplink_opened, self.lease_going)
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
