"""The Redis side of sending: each destination's send queue, the give-up times of what waits for a peer
that is down, and moving re-sends that are due back into their send queues.

Part of :class:`msgbusd.queues.Store`; kept apart so that each module stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from msgbusd import keys

# Removes the first ``count`` entries of a destination's send queue if it still starts with ``first``;
# forgets an emptied queue. KEYS: send queue, destinations set. ARGV: first entry, count, destination.
_DROP_HEAD = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then redis.call('LPOP', KEYS[1], tonumber(ARGV[2])) end
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[3]) end
return 1
"""

# Removes the first entries of a send queue if they are exactly ARGV[2..]; forgets an emptied queue.
# KEYS: send queue, destinations set. ARGV: destination, entries... Returns 0 when they are not.
_DROP_EXACT = """
local n = #ARGV - 1
local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #head ~= n then return 0 end
for i = 1, n do
  if head[i] ~= ARGV[i + 1] then return 0 end
end
redis.call('LPOP', KEYS[1], n)
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return 1
"""

# Moves the re-sends that are due from the outbox to the tail of their destinations' send queues; returns
# the members moved. KEYS: outbox, destinations set. ARGV: now, max count, send queue prefix.
_RELEASE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  local dst = string.match(member, '^req:(%d+)%.') or string.match(member, '^rep:(%d+)|')
  if dst then
    redis.call('RPUSH', ARGV[3] .. dst, member)
    redis.call('SADD', KEYS[2], dst)
  end
end
return due
"""


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SendQueues:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._drop_head = redis.register_script(_DROP_HEAD)
        self._drop_exact = redis.register_script(_DROP_EXACT)
        self._release_due = redis.register_script(_RELEASE_DUE)

    async def pending_destinations(self) -> list[int]:
        """Destinations whose send queue is not empty (what a previous run left to send)."""
        return sorted(int(text(d)) for d in await self.redis.smembers(keys.DESTINATIONS))

    async def send_queue_heads(self, dst: int, count: int) -> list[str]:
        """The first ``count`` entries (``req:<uid>`` or ``rep:<key>``) of ``dst``'s send queue."""
        return [text(e) for e in await self.redis.lrange(keys.send_queue(dst), 0, count - 1)]

    async def drop_send_queue_heads(self, dst: int, first: str, count: int) -> None:
        """Remove the first ``count`` entries of ``dst``'s send queue, which start with ``first``."""
        await self._drop_head(keys=[keys.send_queue(dst), keys.DESTINATIONS], args=[first, count, dst])

    async def send_queue_range(self, dst: int, start: int, count: int) -> list[str]:
        """``count`` entries of ``dst``'s send queue from index ``start``."""
        return [text(e) for e in await self.redis.lrange(keys.send_queue(dst), start, start + count - 1)]

    async def send_queue_length(self, dst: int) -> int:
        return int(await self.redis.llen(keys.send_queue(dst)))

    # --- messages waiting for a peer that is down --------------------------------------------------------

    async def add_give_ups(self, dst: int, times: dict[str, float]) -> None:
        """When each of these send-queue entries gives up waiting for ``dst`` (entries already there keep
        their time)."""
        if times:
            await self.redis.zadd(keys.give_up(dst), times, nx=True)

    async def due_give_ups(self, dst: int, now: float, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(keys.give_up(dst), "-inf", now, start=0, num=limit)
        return [text(m) for m in found]

    async def drop_give_ups(self, dst: int, entries: Sequence[str]) -> None:
        if entries:
            await self.redis.zrem(keys.give_up(dst), *entries)

    async def forget_give_ups(self, dst: int) -> None:
        """``dst`` answers again: nothing waiting for it gives up any more."""
        await self.redis.delete(keys.give_up(dst))

    async def drop_exact(self, dst: int, entries: Sequence[str]) -> bool:
        """Remove ``entries`` from the head of ``dst``'s send queue if it starts with exactly them."""
        done = await self._drop_exact(keys=[keys.send_queue(dst), keys.DESTINATIONS], args=[dst, *entries])
        return bool(done)

    async def release_due(self, now: float, limit: int) -> list[str]:
        """Move up to ``limit`` re-sends due by ``now`` to their send queues; returns them."""
        members = await self._release_due(
            keys=[keys.OUTBOX, keys.DESTINATIONS], args=[now, limit, keys.SEND_QUEUE_PREFIX]
        )
        return [text(m) for m in members]
