"""One sender per destination twin: everything for that twin goes out in order, many messages per POST.

A sender reads the first entries of its destination's send queue in Redis (first sends, re-sends whose
time came, and replies), sends them in one batch, and pops them once the peer has them (or once they moved
to the retry schedule), so what waits for a slow or absent peer stays in Redis, not in memory.

Whether the peer can be reached is the peer's state (:mod:`msgbusd.health`): a send that gets no answer
marks it down, and from then on its sender sends nothing but a probe every second or two, while the
messages wait in the queue (:mod:`msgbusd.waiting` gives up those whose tries or lifetime run out). The
first probe that gets an answer lets the whole queue flow again at batch speed. A peer that answers 503 with
``Retry-After`` is sent the same messages again after that long, without a try being spent.

At most ``workers`` senders send at once, and at most ``workers`` probe at once; the others wait for a
turn. A sender stops when its queue is empty and starts again when kicked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from msgbusd.backoff import REDIS_RECONNECT
from msgbusd.errors import DeliveryError
from msgbusd.logs import about
from msgbusd.outbox import Outbox, SendItem
from msgbusd.queues import Store
from msgbusd.waiting import Waiting

log = logging.getLogger("msgbusd.senders")

# Entries sent per POST at most.
BATCH = 64
# A sender with nothing to send stops after this long (a new one starts when something comes).
IDLE_STOP_S = 30.0

SpawnTask = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass
class _Lane:
    """A destination's sender state.

    ``fresh`` holds what was just accepted for the destination, ready to send, while ``trusted`` says it
    mirrors the head of the Redis send queue exactly; then the sender sends from memory and only pops Redis
    (checking the entries match). Anything unexpected makes the lane untrusted: it sends from Redis again
    until the queue is empty.
    """

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    fresh: deque[SendItem] = field(default_factory=deque)
    trusted: bool = False
    # Something was queued while untrusted: an empty read of Redis does not prove the lane is in step.
    missed: bool = False
    # While the peer is down: how many entries at the head of the queue have their give-up time written.
    noted: int = 0
    # The peer asked us to wait (503 with Retry-After) until this time (monotonic).
    paused_until: float = 0.0

    def distrust(self) -> None:
        self.trusted = False
        self.fresh.clear()


class Senders:
    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        spawn: SpawnTask,
        stopping: asyncio.Event,
        *,
        workers: int = 1000,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._health = outbox.health
        self._waiting = Waiting(store, outbox)
        self._spawn = spawn
        self._stopping = stopping
        self._turns = asyncio.Semaphore(workers)
        self._probe_turns = asyncio.Semaphore(workers)
        self._lanes: dict[int, _Lane] = {}

    def kick(self, dst: int, items: Sequence[SendItem] | None = None) -> None:
        """``items`` were just queued for ``dst`` (None: something was, not known what): wake its sender,
        handing them over, or start one."""
        lane = self._lanes.get(dst)
        if lane is None:
            if self._stopping.is_set():
                return
            lane = self._lanes[dst] = _Lane()
            self._spawn(self._run(dst, lane), f"sender to twin {dst}")
        if items is None:
            lane.distrust()
            lane.missed = True
        elif lane.trusted:
            lane.fresh.extend(items)
        elif items:
            lane.missed = True
        lane.wake.set()

    async def resume(self) -> None:
        """Start a sender for every destination a previous run left messages for; each probes its peer
        before it sends."""
        for dst in await self._store.pending_destinations():
            self._health.unknown(dst)
            self.kick(dst)

    async def _run(self, dst: int, lane: _Lane) -> None:
        redis_failures = 0
        try:
            while not self._stopping.is_set():
                lane.wake.clear()
                try:
                    if not await self._step(dst, lane):
                        return
                    redis_failures = 0
                except (RedisError, OSError) as exc:
                    # The queue is in Redis: nothing is lost, the sender just waits for Redis to be back.
                    lane.distrust()
                    redis_failures += 1
                    delay = REDIS_RECONNECT.delay_s(redis_failures)
                    self._outbox.metrics.error("redis")
                    log.warning(
                        "sender to twin %s: redis failed (%s); again in %.1fs",
                        dst,
                        exc,
                        delay,
                        extra=about(dst=dst),
                    )
                    await self._pause(delay)
        finally:
            if self._lanes.get(dst) is lane:
                del self._lanes[dst]

    async def _step(self, dst: int, lane: _Lane) -> bool:
        """One turn of the sender; False when it should stop (idle long enough, or nothing left)."""
        if self._health.is_down(dst):
            return await self._while_down(dst, lane)
        if lane.paused_until > time.monotonic():
            lane.distrust()
            await self._pause(lane.paused_until - time.monotonic())
            return True
        if lane.trusted and lane.fresh:
            async with self._turns:
                await self._send_fresh(dst, lane)
        elif not lane.trusted:
            lane.missed = False
            async with self._turns:
                more = await self._send_some(dst, lane)
            if not more:
                # Queue empty and nothing queued meanwhile: memory and Redis are in step.
                lane.trusted = not lane.missed
        else:
            return await self._idle(lane)
        return True

    async def _idle(self, lane: _Lane) -> bool:
        """Wait for more to send; False once the lane has been idle long enough, or the daemon stops."""
        woken = asyncio.ensure_future(lane.wake.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([woken, stopping], timeout=IDLE_STOP_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            stopping.cancel()
        return not self._stopping.is_set() and (lane.wake.is_set() or bool(lane.fresh))

    # --- a peer that is down -----------------------------------------------------------------------------

    async def _while_down(self, dst: int, lane: _Lane) -> bool:
        """Wait for the next probe and make it; while the peer stays down, give up what waited long enough.
        False once nothing is left waiting for the peer."""
        lane.distrust()
        await self._pause(self._health.seconds_until_probe(dst))
        if self._stopping.is_set():
            return False
        # Probes have turns of their own: a probe of a site that swallows packets waits out its timeout, and
        # peers that are down must not hold back the sends to the others.
        async with self._probe_turns:
            error = await self._outbox.probe(dst)
        if error is not None and error.retry_after_s is not None:
            # Up, but its Redis is away: no attempt failed, nothing gives up.
            self._health.busy(dst, error.retry_after_s)
            return True
        async with self._turns:
            if error is None:
                await self._peer_back(dst, lane)
                return True
            self._peer_down(dst, error)
            lane.noted = await self._waiting.note(dst, lane.noted)
            await self._waiting.give_up_due(dst)
            lane.noted = max(0, lane.noted - await self._waiting.trim(dst, BATCH))
            return await self._store.send_queue_length(dst) > 0

    async def _peer_back(self, dst: int, lane: _Lane) -> None:
        down_s = self._health.answered(dst)
        await self._waiting.forget(dst)
        lane.noted = 0
        if down_s is not None:
            log.warning(
                "twin %s answers again after %.1fs; sending the %d message(s) waiting for it",
                dst,
                down_s,
                await self._store.send_queue_length(dst),
                extra=about(dst=dst),
            )

    def _peer_down(self, dst: int, error: DeliveryError) -> None:
        if self._health.unreachable(dst, error.cause):
            log.warning(
                "holding messages to twin %s while it is unreachable: %s; probing it every second or two",
                dst,
                error.cause,
                extra=about(dst=dst),
            )

    # --- sending -----------------------------------------------------------------------------------------

    async def _send_fresh(self, dst: int, lane: _Lane) -> None:
        """Send what was just queued straight from memory; the Redis queue is popped, not read."""
        items = [lane.fresh.popleft() for _ in range(min(BATCH, len(lane.fresh)))]
        entries = [item.entry for item in items]
        done, replies = await self._deliver(dst, lane, entries, items)
        if done == len(entries):
            if not await self._store.sent(dst, replies, exact=entries):
                # The queue is not what memory says (another writer got in between): the Redis path sends
                # from the queue again (receivers drop duplicates).
                lane.distrust()
            return
        # Held messages: pop only what is certainly dealt with, and let the Redis path send the rest.
        lane.distrust()
        await self._store.sent(dst, replies, exact=entries[:done])

    async def _send_some(self, dst: int, lane: _Lane) -> bool:
        """Send the next batch of ``dst``'s queue; False when the queue is empty."""
        entries = await self._store.send_queue_heads(dst, BATCH)
        if not entries:
            return False
        items = await self._outbox.prepare(entries)
        done, replies = await self._deliver(dst, lane, entries, items) if items else (len(entries), [])
        await self._store.sent(dst, replies, head=(entries[0], done))
        return True

    async def _deliver(
        self, dst: int, lane: _Lane, entries: list[str], items: list[SendItem]
    ) -> tuple[int, list[str]]:
        """Send ``items``; returns how many leading entries are dealt with (the rest wait in the queue), and
        the keys of the replies the peer took (to forget)."""
        outbox = self._outbox
        results = await outbox.send_items(dst, items)
        replies = outbox.items_sent([it for it, error in zip(items, results, strict=True) if error is None])
        for index, (item, error) in enumerate(zip(items, results, strict=True)):
            if error is None:
                continue
            if error.retry_after_s is not None:
                log.info(
                    "twin %s cannot take messages now (%s); sending again in %.1fs",
                    dst,
                    error.cause,
                    error.retry_after_s,
                    extra=about(dst=dst),
                )
                lane.paused_until = time.monotonic() + error.retry_after_s
                return entries.index(item.entry), replies
            if error.offline:
                self._peer_down(dst, error)
                if not outbox.hold_offline:
                    attempted = [
                        it for it, e in zip(items[index:], results[index:], strict=True) if e and e.attempted
                    ]
                    await outbox.failed_while_offline(attempted, error.cause)
                return entries.index(item.entry), replies
            await outbox.item_failed(item, error.cause, final=error.final)
        return len(entries), replies

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s``, or until the daemon stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(delay_s, 0.01))
