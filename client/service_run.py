"""One run of a :class:`~client.service.Service`: taking requests, running handlers, queueing replies.

For each command a taker moves requests into the service's processing list, as many at once as handlers are
free (``workers`` per command), and starts a handler for each; a slow handler never holds up the others.
One flusher queues the replies of finished handlers on ``msgbus.system.reply``, many per transaction, each
in the same transaction that removes its request from the processing list. A service killed meanwhile
finds its unanswered requests there at the next start (:mod:`wire.reliable_list`): every request reaches a
handler at least once. A Redis that is away, or full (:class:`~client.errors.SiteRedisFull`: it refuses the
moves and the replies), is tried again with backoff; in burst mode a taker raises its error instead (replies
are always tried again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from client.errors import SiteRedisFull, refused_when_full
from wire import keys
from wire.backoff import REDIS_RECONNECT, sleep_unless
from wire.envelope import Envelope
from wire.reliable_list import ReliableList

log = logging.getLogger("client.service")

# Requests taken in one round trip at most.
TAKE_BATCH = 256
# Attempts to queue the last replies once stopping, before leaving them for the next start.
FLUSH_TRIES_WHEN_STOPPING = 4
# What a full Redis refuses a service that takes requests (they are moved, a write).
HANDING_REQUESTS_OVER = "to hand requests over"

ServeOne = Callable[[bytes], Awaitable[Envelope | None]]


class ServiceRun:
    """Serve the ``lists`` (one per command) with ``serve_one`` until ``stopping`` is set (or, in ``burst``
    mode, until they are empty). Handlers running then get ``grace_s`` to finish (None: as long as they
    take); what is not finished stays in the processing list for the next start."""

    def __init__(
        self,
        conn: aioredis.Redis,
        lists: Sequence[ReliableList],
        serve_one: ServeOne,
        stopping: asyncio.Event,
        *,
        workers: int,
        poll_s: float,
        burst: bool = False,
        grace_s: float | None = None,
    ) -> None:
        self._conn = conn
        self._lists = lists
        self._serve_one = serve_one
        self._stopping = stopping
        self._workers = workers
        self._poll_s = poll_s
        self._burst = burst
        self._grace_s = grace_s
        self._done: list[tuple[ReliableList, bytes, bytes | None]] = []
        self._done_event = asyncio.Event()
        self._inflight: dict[str, int] = {source.queue: 0 for source in lists}
        self._room = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        for source in self._lists:
            await self._take_back(source)
        closing = asyncio.Event()
        flusher = asyncio.create_task(self._flush_forever(closing))
        try:
            async with asyncio.TaskGroup() as group:
                waker = group.create_task(self._wake_takers_on_stop())
                async with asyncio.TaskGroup() as takers:
                    for source in self._lists:
                        takers.create_task(self._take_forever(source))
                waker.cancel()
            await self._finish_handlers()
        finally:
            closing.set()
            self._done_event.set()
            await flusher

    async def _take_back(self, source: ReliableList) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                with refused_when_full(HANDING_REQUESTS_OVER):
                    moved = await source.take_back()
            except (RedisError, OSError, SiteRedisFull) as exc:
                failures += 1
                await self._wait_for_redis(exc, failures, f"take back the requests of {source.queue}")
                continue
            if moved:
                log.warning("took back %d unfinished request(s) of %s", moved, source.queue)
            return

    async def _wait_for_redis(self, exc: Exception, failures: int, doing: str) -> None:
        """After the ``failures``-th Redis failure in a row, wait before trying again (burst mode: raise)."""
        if self._burst:
            raise exc
        log.warning("cannot %s (%s); trying again", doing, exc)
        await sleep_unless(self._stopping, REDIS_RECONNECT.delay_s(failures))

    async def _wake_takers_on_stop(self) -> None:
        await self._stopping.wait()
        async with self._room:
            self._room.notify_all()

    async def _take_forever(self, source: ReliableList) -> None:
        failures = 0
        while not self._stopping.is_set():
            async with self._room:
                await self._room.wait_for(
                    lambda: self._stopping.is_set() or self._inflight[source.queue] < self._workers
                )
                room = self._workers - self._inflight[source.queue]
            if self._stopping.is_set():
                return
            try:
                count = min(room, TAKE_BATCH)
                with refused_when_full(HANDING_REQUESTS_OVER):
                    raws = await (source.take_now(count) if self._burst else source.take(count, self._poll_s))
                failures = 0
            except (RedisError, OSError, SiteRedisFull) as exc:
                failures += 1
                await self._wait_for_redis(exc, failures, f"take requests from {source.queue}")
                continue
            if not raws and self._burst:
                return
            for raw in raws:
                self._inflight[source.queue] += 1
                task = asyncio.create_task(self._serve(source, raw))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _serve(self, source: ReliableList, raw: bytes) -> None:
        try:
            reply = await self._serve_one(raw)
        except Exception:
            log.exception("serving a request of %s failed unexpectedly", source.queue)
            reply = None
        self._done.append((source, raw, None if reply is None else reply.encode()))
        self._done_event.set()

    async def _finish_handlers(self) -> None:
        if not self._tasks:
            return
        # A handler may wait long (a broker that is away, a slow service): what is not done in the grace
        # time is left in its processing list, for the next start.
        _, unfinished = await asyncio.wait(set(self._tasks), timeout=self._grace_s)
        for task in unfinished:
            task.cancel()
        if unfinished:
            log.warning("%d request(s) left unanswered for the next start", len(unfinished))
            await asyncio.wait(unfinished)

    async def _flush_forever(self, closing: asyncio.Event) -> None:
        """Queue the replies of finished handlers, many per round trip, until closed and all are queued."""
        failures = 0
        while True:
            await self._done_event.wait()
            self._done_event.clear()
            if not self._done:
                if closing.is_set():
                    return
                continue
            batch, self._done = self._done, []
            try:
                await self._flush(batch)
                failures = 0
            except (RedisError, OSError, SiteRedisFull) as exc:
                self._done[:0] = batch
                failures += 1
                if closing.is_set() and failures >= FLUSH_TRIES_WHEN_STOPPING:
                    log.error("%d reply(ies) left unsent; handled again at the next start", len(batch))
                    return
                log.warning("cannot queue replies (%s); trying again", exc)
                await asyncio.sleep(REDIS_RECONNECT.delay_s(failures))
                self._done_event.set()
                continue
            async with self._room:
                for source, _, _ in batch:
                    self._inflight[source.queue] -= 1
                self._room.notify_all()
            if closing.is_set():
                self._done_event.set()

    async def _flush(self, batch: list[tuple[ReliableList, bytes, bytes | None]]) -> None:
        with refused_when_full("replies"):
            async with self._conn.pipeline(transaction=True) as pipe:
                for source, raw, reply in batch:
                    if reply is not None:
                        pipe.lpush(keys.REPLY, reply)
                    source.ack_on(pipe, raw)
                await pipe.execute()
