"""One sender per destination twin: first attempts go out in the order they were accepted, many per POST.

A sender reads the first entries of its destination's send queue in Redis (requests and replies), sends
them in one batch, and pops them once the peer has them (or once they moved to the retry schedule), so
what waits for a slow or absent peer stays in Redis, not in memory. While the peer's circuit is open a
sender either fails messages fast, spending one try each as go-rmb would, or with ``hold_offline`` keeps
them, probing the peer until it answers, and then lets them flow in order. A sender stops when its queue
is empty and starts again when kicked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from msgbusd.backoff import REDIS_RECONNECT
from msgbusd.logs import about
from msgbusd.outbox import Outbox, SendItem
from msgbusd.queues import Store

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

    def distrust(self) -> None:
        self.trusted = False
        self.fresh.clear()


class Senders:
    def __init__(self, store: Store, outbox: Outbox, spawn: SpawnTask, stopping: asyncio.Event) -> None:
        self._store = store
        self._outbox = outbox
        self._spawn = spawn
        self._stopping = stopping
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
        """Start a sender for every destination a previous run left messages for."""
        for dst in await self._store.pending_destinations():
            self.kick(dst)

    async def _run(self, dst: int, lane: _Lane) -> None:
        redis_failures = 0
        try:
            while not self._stopping.is_set():
                lane.wake.clear()
                try:
                    if lane.trusted and lane.fresh:
                        await self._send_fresh(dst, lane)
                    elif not lane.trusted:
                        lane.missed = False
                        if not await self._send_some(dst):
                            # Queue empty and nothing queued meanwhile: memory and Redis are in step.
                            lane.trusted = not lane.missed
                    elif not await self._idle(lane):
                        return
                    redis_failures = 0
                except (RedisError, OSError) as exc:
                    # The queue is in Redis: nothing is lost, the sender just waits for Redis to be back.
                    lane.distrust()
                    redis_failures += 1
                    delay = REDIS_RECONNECT.delay_s(redis_failures)
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

    async def _send_fresh(self, dst: int, lane: _Lane) -> None:
        """Send what was just queued straight from memory; the Redis queue is popped, not read."""
        items = [lane.fresh.popleft() for _ in range(min(BATCH, len(lane.fresh)))]
        entries = [item.entry for item in items]
        if not self._outbox.health.may_send(dst):
            lane.distrust()  # offline handling (hold or fail fast) works from Redis
            return
        done = await self._deliver(dst, entries, items)
        if done == len(entries) and await self._store.drop_exact(dst, entries):
            return
        # Held messages, or a queue that is not what memory says (another writer got in between): pop only
        # what is certainly dealt with, and let the Redis path send the rest (receivers drop duplicates).
        lane.distrust()
        if done:
            await self._store.drop_exact(dst, entries[:done])

    async def _send_some(self, dst: int) -> bool:
        """Send the next batch of ``dst``'s queue; False when the queue is empty."""
        outbox = self._outbox
        entries = await self._store.send_queue_heads(dst, BATCH)
        if not entries:
            return False
        items = await outbox.prepare(entries)
        if not items:
            await self._store.drop_send_queue_heads(dst, entries[0], len(entries))
            return True
        if not outbox.health.may_send(dst):
            if outbox.hold_offline:
                await self._pause(outbox.health.seconds_until_probe(dst))
                return True
            for item in items:
                await outbox.item_failed(item, outbox.unreachable_cause(dst))
            await self._store.drop_send_queue_heads(dst, entries[0], len(entries))
            return True
        done = await self._deliver(dst, entries, items)
        if done:
            await self._store.drop_send_queue_heads(dst, entries[0], done)
        return True

    async def _deliver(self, dst: int, entries: list[str], items: list[SendItem]) -> int:
        """Send ``items``; returns how many leading entries are dealt with (the rest are held)."""
        outbox = self._outbox
        results = await outbox.send_items(dst, items)
        await outbox.items_sent([item for item, error in zip(items, results, strict=True) if error is None])
        for item, error in zip(items, results, strict=True):
            if error is None:
                continue
            if error.offline and outbox.hold_offline:
                log.info(
                    "holding messages to twin %s while it is unreachable: %s",
                    dst,
                    error.cause,
                    extra=about(dst=dst),
                )
                return entries.index(item.entry)
            await outbox.item_failed(item, error.cause, final=error.final)
        return len(entries)

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s`` (until the next probe is due), or until the daemon stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(delay_s, 0.01))
