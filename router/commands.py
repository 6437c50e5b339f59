"""Serving the routers' commands from their ``msgbus.<cmd>`` lists, in batches.

The daemon hands requests for a command to ``msgbus.<cmd>`` (LPUSH). For each command, a taker moves up to
a batch of them at once (oldest first) into the command's processing list and starts a handler for each,
up to ``concurrency`` at a time; a slow handler (an HTTP call) never holds up the others. Replies are
queued on ``msgbus.system.reply`` in batches, each in the same transaction that removes its request from
the processing list. A daemon killed meanwhile finds its unanswered requests there at the next start, so
every request is handled at least once, and a round trip to Redis serves many requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from client.errors import HandlerError
from client.request import HandlerResult, Request, encode_result, reply_envelope
from msgbusd import keys
from msgbusd.backoff import Backoff, sleep_unless
from msgbusd.envelope import Envelope, EnvelopeDecodeError, decode_payload
from router.protocol import FrameError

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[HandlerResult]]

BATCH = 256
REDIS_RETRY = Backoff(base_s=0.1, max_s=5.0)

# Moves up to ARGV[1] items from the right of a list (its oldest) to the left of its processing list.
_TAKE_MORE = """
local items = {}
for i = 1, tonumber(ARGV[1]) do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not item then break end
  items[i] = item
end
return items
"""


class CommandServer:
    def __init__(
        self,
        redis: aioredis.Redis,
        handlers: Mapping[str, Handler],
        *,
        name: str,
        concurrency: int,
        block_s: float = 1.0,
        grace_s: float = 10.0,
    ) -> None:
        self._redis = redis
        self._handlers = {keys.command_queue(cmd): handler for cmd, handler in handlers.items()}
        self._name = name
        self._concurrency = concurrency
        self._block_s = block_s
        self._grace_s = grace_s
        self._take_more = redis.register_script(_TAKE_MORE)
        self._done: list[tuple[str, bytes, bytes | None]] = []
        self._done_event = asyncio.Event()
        self._inflight: dict[str, int] = dict.fromkeys(self._handlers, 0)
        self._room = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()

    def processing(self, queue: str) -> str:
        return keys.service_processing(queue, self._name)

    async def run(self, stopping: asyncio.Event) -> None:
        """Serve until ``stopping`` is set, then let the handlers running finish and queue their replies."""
        await self._recover(stopping)
        closing = asyncio.Event()
        flusher = asyncio.create_task(self._flush_forever(closing))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._wake_takers_on(stopping))
                for queue in self._handlers:
                    group.create_task(self._take_forever(queue, stopping))
            if self._tasks:
                # A handler may wait long (a broker that is away, a slow service): what is not done in the
                # grace time is left in its processing list, for the next start.
                _, unfinished = await asyncio.wait(self._tasks, timeout=self._grace_s)
                for task in unfinished:
                    task.cancel()
                if unfinished:
                    log.warning("router: %d request(s) left for the next start", len(unfinished))
                    await asyncio.wait(unfinished)
        finally:
            closing.set()
            self._done_event.set()
            await flusher

    async def _wake_takers_on(self, stopping: asyncio.Event) -> None:
        await stopping.wait()
        async with self._room:
            self._room.notify_all()

    async def _recover(self, stopping: asyncio.Event) -> None:
        failures = 0
        for queue in self._handlers:
            while not stopping.is_set():
                try:
                    moved = 0
                    # Newest first onto the end taken from: the oldest comes out first again.
                    while await self._redis.lmove(self.processing(queue), queue, "LEFT", "RIGHT"):
                        moved += 1
                    if moved:
                        log.warning("router: took back %d unanswered request(s) of %s", moved, queue)
                    break
                except (RedisError, OSError) as exc:
                    failures += 1
                    log.warning("router: cannot recover %s (%s); trying again", queue, exc)
                    await sleep_unless(stopping, REDIS_RETRY.delay_s(failures))

    async def _take_forever(self, queue: str, stopping: asyncio.Event) -> None:
        failures = 0
        while not stopping.is_set():
            async with self._room:
                await self._room.wait_for(
                    lambda: stopping.is_set() or self._inflight[queue] < self._concurrency
                )
                room = self._concurrency - self._inflight[queue]
            if stopping.is_set():
                return
            try:
                raws = await self._take(queue, min(room, BATCH))
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                log.warning("router: cannot take requests from %s (%s); trying again", queue, exc)
                await sleep_unless(stopping, REDIS_RETRY.delay_s(failures))
                continue
            for raw in raws:
                self._inflight[queue] += 1
                task = asyncio.create_task(self._serve(queue, raw))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _take(self, queue: str, count: int) -> list[bytes]:
        processing = self.processing(queue)
        async with self._redis.pipeline(transaction=False) as pipe:
            # redis-py types the timeout as int, but Redis takes (and sends) fractional seconds.
            pipe.blmove(queue, processing, cast(int, self._block_s), "RIGHT", "LEFT")
            pipe.evalsha(self._take_more.sha, 2, queue, processing, count - 1)
            first, more = await pipe.execute(raise_on_error=False)
        if isinstance(first, Exception):
            raise first
        if first is None:
            return []
        if isinstance(more, Exception):
            more = await self._take_more(keys=[queue, processing], args=[count - 1])
        return [first, *more]

    async def _serve(self, queue: str, raw: bytes) -> None:
        try:
            reply = await self._handle(queue, raw)
        except Exception:
            log.exception("router: serving a request of %s failed unexpectedly", queue)
            reply = None
        self._done.append((queue, raw, None if reply is None else reply.encode()))
        self._done_event.set()

    async def _handle(self, queue: str, raw: bytes) -> Envelope | None:
        try:
            request = Envelope.decode(raw)
        except EnvelopeDecodeError as exc:
            log.error("router: dropped an undecodable request on %s: %s", queue, exc.reason)
            return None
        try:
            data = decode_payload(request.dat)
        except ValueError as exc:
            return reply_envelope(request, err=f"invalid request: {exc}")
        try:
            result = await self._handlers[queue](Request(data, request))
            return reply_envelope(request, encode_result(result))
        except (HandlerError, FrameError) as exc:  # a frame this version cannot read is the sender's error
            return reply_envelope(request, err=str(exc) or type(exc).__name__)
        except Exception as exc:
            log.exception(
                "router: %s failed on request %s from twin %d", request.cmd, request.uid, request.src
            )
            return reply_envelope(request, err=f"{type(exc).__name__}: {exc}")

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
            except (RedisError, OSError) as exc:
                self._done[:0] = batch
                failures += 1
                if closing.is_set() and failures > 3:
                    log.error(
                        "router: %d reply(ies) left unsent; handled again at the next start", len(batch)
                    )
                    return
                log.warning("router: cannot queue replies (%s); trying again", exc)
                await asyncio.sleep(REDIS_RETRY.delay_s(failures))
                self._done_event.set()
                continue
            async with self._room:
                for queue, _, _ in batch:
                    self._inflight[queue] -= 1
                self._room.notify_all()
            if closing.is_set():
                self._done_event.set()

    async def _flush(self, batch: list[tuple[str, bytes, bytes | None]]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for queue, raw, reply in batch:
                if reply is not None:
                    pipe.lpush(keys.REPLY, reply)
                pipe.lrem(self.processing(queue), 1, cast(Any, raw))
            await pipe.execute()
