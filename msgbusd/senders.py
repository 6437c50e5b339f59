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
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from msgbusd.backoff import REDIS_RECONNECT
from msgbusd.outbox import Outbox, SendItem
from msgbusd.queues import Store

log = logging.getLogger("msgbusd.senders")

# Entries sent per POST at most.
BATCH = 64

SpawnTask = Callable[[Coroutine[Any, Any, None], str], None]


class Senders:
    def __init__(self, store: Store, outbox: Outbox, spawn: SpawnTask, stopping: asyncio.Event) -> None:
        self._store = store
        self._outbox = outbox
        self._spawn = spawn
        self._stopping = stopping
        self._wake: dict[int, asyncio.Event] = {}

    def kick(self, dst: int) -> None:
        """There is something new in ``dst``'s send queue: wake its sender, or start one."""
        wake = self._wake.get(dst)
        if wake is not None:
            wake.set()
            return
        if self._stopping.is_set():
            return
        self._wake[dst] = asyncio.Event()
        self._spawn(self._run(dst), f"sender to twin {dst}")

    async def resume(self) -> None:
        """Start a sender for every destination a previous run left messages for."""
        for dst in await self._store.pending_destinations():
            self.kick(dst)

    async def _run(self, dst: int) -> None:
        wake = self._wake[dst]
        redis_failures = 0
        try:
            while not self._stopping.is_set():
                wake.clear()
                try:
                    if not await self._send_some(dst):
                        if wake.is_set():
                            continue
                        return
                    redis_failures = 0
                except (RedisError, OSError) as exc:
                    # The queue is in Redis: nothing is lost, the sender just waits for Redis to be back.
                    redis_failures += 1
                    delay = REDIS_RECONNECT.delay_s(redis_failures)
                    log.warning("sender to twin %s: redis failed (%s); again in %.1fs", dst, exc, delay)
                    await self._pause(delay)
        finally:
            if self._wake.get(dst) is wake:
                del self._wake[dst]

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
        for item, error in zip(items, results, strict=True):
            if error is None:
                await outbox.item_sent(item)
            elif error.offline and outbox.hold_offline:
                log.info("holding messages to twin %s while it is unreachable: %s", dst, error.cause)
                return entries.index(item.entry)
            else:
                await outbox.item_failed(item, error.cause)
        return len(entries)

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s`` (until the next probe is due), or until the daemon stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(delay_s, 0.01))
