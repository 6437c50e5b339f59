"""One sender per destination twin: first attempts go out in the order the requests were accepted.

A sender reads the head of its destination's send queue in Redis, sends it, and pops it once the peer has
it (or once it moved to the retry schedule), so what waits for a slow or absent peer stays in Redis, not in
memory. While the peer's circuit is open a sender either fails messages fast, spending one try each as
go-rmb would, or with ``hold_offline`` keeps them, probing the peer with the head message until it answers,
and then lets them flow in order. A sender stops when its queue is empty and starts again when kicked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from msgbusd.backoff import REDIS_RECONNECT
from msgbusd.outbox import Outbox
from msgbusd.queues import Store

log = logging.getLogger("msgbusd.senders")

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
                    uid = await self._store.send_queue_head(dst)
                    if uid is None:
                        if wake.is_set():
                            continue
                        return
                    await self._send_head(dst, uid)
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

    async def _send_head(self, dst: int, uid: str) -> None:
        outbox = self._outbox
        original = await outbox.load_original(uid)
        if original is None:
            await self._store.drop_send_queue_head(dst, uid)
            return
        if not outbox.health.may_send(dst):
            if outbox.hold_offline:
                await self._pause(outbox.health.seconds_until_probe(dst))
            else:
                await outbox.failed(uid, original, outbox.unreachable_cause(dst))
                await self._store.drop_send_queue_head(dst, uid)
            return
        error = await outbox.deliver(uid, original, failures=0)
        if error is not None and error.offline and outbox.hold_offline:
            log.info("holding messages to twin %s while it is unreachable: %s", dst, error.cause)
            return
        if error is not None:
            await outbox.failed(uid, original, error.cause)
        await self._store.drop_send_queue_head(dst, uid)

    async def _pause(self, delay_s: float) -> None:
        """Wait until the next probe is due, or until the daemon stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(delay_s, 0.01))
