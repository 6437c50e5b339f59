"""A Redis list consumed without losing an item: every consumer of a list on the bus takes from it this way.

An item is moved atomically from the list into a processing list that belongs to the consumer, and leaves
that list only when the consumer acknowledges it (LREM, usually in the same transaction or script as the
item's hand-off). Whatever a consumer that died or lost its connection held is moved back to the head of
the list by :meth:`ReliableList.take_back`, oldest first again, so every item is handled at least once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, RedisError

from wire.backoff import REDIS_RECONNECT, Backoff, sleep_unless

log = logging.getLogger(__name__)

End = Literal["LEFT", "RIGHT"]

# Moves up to ARGV[1] items from one end of a list (ARGV[2]) to an end of another (ARGV[3]), without blocking;
# none unless at least ARGV[4] items wait. KEYS: from, to.
_MOVE_MANY = """
local items = {}
if redis.call('LLEN', KEYS[1]) < tonumber(ARGV[4]) then return items end
for i = 1, tonumber(ARGV[1]) do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], ARGV[2], ARGV[3])
  if not item then break end
  items[i] = item
end
return items
"""

# Moves a whole list (ARGV[1]: the end taken from) onto an end of another (ARGV[2]). KEYS: from, to.
_MOVE_ALL = """
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], ARGV[1], ARGV[2]) do
  moved = moved + 1
end
return moved
"""

_OTHER_END: dict[End, End] = {"LEFT": "RIGHT", "RIGHT": "LEFT"}


class ReliableList:
    """The list ``queue`` consumed oldest first from its ``oldest`` end (the end producers do not push to),
    with the processing list ``processing``."""

    def __init__(
        self,
        redis: aioredis.Redis,
        queue: str,
        processing: str,
        *,
        oldest: End,
        take_back_guard: asyncio.Lock | None = None,
    ) -> None:
        self.redis = redis
        self.queue = queue
        self.processing = processing
        # Held by whoever else puts items in the processing list and acknowledges them itself: they are not
        # taken back from under it.
        self._take_back_guard = take_back_guard
        self._oldest = oldest
        self._newest = _OTHER_END[oldest]
        self._move_many = redis.register_script(_MOVE_MANY)
        self._move_all = redis.register_script(_MOVE_ALL)

    async def take(self, count: int, block_s: float) -> list[bytes]:
        """Move up to ``count`` items, oldest first, into the processing list in one round trip: waits up to
        ``block_s`` for the first, then takes what else is there."""
        # redis-py types the timeout as int, but Redis takes (and sends) fractional seconds.
        timeout = cast(int, block_s)
        if count == 1:
            return _listed(
                await self.redis.blmove(self.queue, self.processing, timeout, self._oldest, self._newest)
            )
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.blmove(self.queue, self.processing, timeout, self._oldest, self._newest)
            pipe.evalsha(
                self._move_many.sha, 2, self.queue, self.processing, count - 1, self._oldest, self._newest, 0
            )
            first, rest = await pipe.execute(raise_on_error=False)
        if isinstance(first, Exception):
            raise first
        if isinstance(rest, NoScriptError):
            rest = await self.take_now(count - 1)
        elif isinstance(rest, Exception):
            raise rest
        return [first, *rest] if first is not None else list(rest)

    async def take_now(self, count: int, *, at_least: int = 0) -> list[bytes]:
        """Move up to ``count`` items into the processing list without waiting; none unless ``at_least``
        items wait."""
        if count == 1 and not at_least:
            return _listed(await self.redis.lmove(self.queue, self.processing, self._oldest, self._newest))
        moved = await self._move_many(
            keys=[self.queue, self.processing], args=[count, self._oldest, self._newest, at_least]
        )
        return list(moved)

    async def take_back(self) -> int:
        """Move everything in the processing list back to the head of the queue, keeping its order; returns
        how many items. Only while no one consumes with this processing list."""
        if self._take_back_guard is None:
            return await self._take_back_all()
        async with self._take_back_guard:
            return await self._take_back_all()

    async def _take_back_all(self) -> int:
        moved = await self._move_all(keys=[self.processing, self.queue], args=[self._newest, self._oldest])
        return int(moved)

    def ack_on(self, pipe: Pipeline, raw: bytes) -> None:
        """Queue the acknowledgement of ``raw`` on ``pipe`` (by value: sent again, it removes nothing)."""
        pipe.lrem(self.processing, 1, cast(Any, raw))

    async def ack(self, raws: Sequence[bytes]) -> None:
        if not raws:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for raw in raws:
                self.ack_on(pipe, raw)
            await pipe.execute()


def _listed(item: bytes | str | None) -> list[bytes]:
    return [] if item is None else [cast(bytes, item)]


async def consume_in_order(
    source: ReliableList,
    handle: Callable[[list[bytes]], Awaitable[None]],
    stopping: asyncio.Event,
    *,
    batch: int,
    block_s: float,
    turned: Callable[[], None] = lambda: None,
    retry: Backoff = REDIS_RECONNECT,
    retry_soon: tuple[type[Exception], ...] = (),
    behind: int = 0,
) -> None:
    """Take up to ``batch`` items at a time and hand each batch to ``handle`` before taking the next, so
    items are handled in queue order, until ``stopping`` is set. ``handle`` acknowledges each item it is done
    with; ``turned`` is called at every turn of the loop (a heartbeat). After a failure of one of the kinds
    ``retry_soon`` (which took its time already), the next try waits the shortest delay, not a growing one.

    With ``behind``, the loop helps the list's usual consumer rather than waiting for items itself: it takes
    only while ``behind`` items or more wait, and looks again every ``block_s`` otherwise.

    What a previous consumer left in the processing list is taken back first. So is, after a failure, what
    this loop left there: a pop whose answer Redis did not send before it went away (a restart does not
    flush its answers), or a batch ``handle`` did not finish (it raised). ``handle`` must therefore not do
    twice what it finished once: each of its hand-offs acknowledges its item in the same atomic step.
    """
    failures = 0
    take_back: str | None = "left by the previous run"
    while not stopping.is_set():
        turned()
        try:
            if take_back is not None:
                moved = await source.take_back()
                if moved:
                    log.warning("took back %d unfinished item(s) of %s %s", moved, source.queue, take_back)
                take_back = None
            if behind:
                items = await source.take_now(batch, at_least=behind)
            else:
                items = await source.take(batch, block_s)
            if items:
                await handle(items)
            failures = 0
            if behind and not items:
                await sleep_unless(stopping, block_s)
        except Exception as exc:
            failures = 1 if isinstance(exc, retry_soon) else failures + 1
            take_back = "after a failure"
            delay = retry.delay_s(failures)
            if isinstance(exc, RedisError | OSError):
                log.error("%s: redis failed (%s); trying again in %.1fs", source.queue, exc, delay)
            else:
                log.exception("%s: handling a batch failed; trying again in %.1fs", source.queue, delay)
            await sleep_unless(stopping, delay)
