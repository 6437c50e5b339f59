"""The Redis side of sending: each destination's send queue, the give-up times of what waits for a peer
that is down, and moving re-sends that are due back into their send queues.

Part of :class:`msgbusd.store.queues.Store`; kept apart so that each module stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from msgbusd.store.shared_round_trips import SharedRoundTrips
from wire import keys
from wire.redis_url import as_text

# After a send: forgets the replies the peer now has (payload, state, outbox entry) and takes what was sent
# out of the send queue, all at once. KEYS: send queue, destinations set, replies, reply states, outbox. ARGV:
# destination, then either 'exact', n and the n entries sent (popped if the queue starts with exactly them,
# else taken out of the queue's first 2n entries, wherever they are) or 'head', n and one entry (pop n entries
# if the queue still starts with it), then the keys of the replies to forget. Returns 1 when the queue started
# with what was given, else 0.
_SENT = """
local n = tonumber(ARGV[3])
local given = n
if ARGV[2] == 'head' and n > 0 then given = 1 end
local exact = 1
if n > 0 then
  if ARGV[2] == 'head' then
    if redis.call('LINDEX', KEYS[1], 0) == ARGV[4] then redis.call('LPOP', KEYS[1], n) else exact = 0 end
  else
    local window = redis.call('LRANGE', KEYS[1], 0, 2 * n - 1)
    for i = 1, n do
      if window[i] ~= ARGV[3 + i] then exact = 0 end
    end
    if exact == 1 then
      redis.call('LPOP', KEYS[1], n)
    else
      local sent = {}
      for i = 1, n do sent[ARGV[3 + i]] = true end
      local kept = {}
      for _, entry in ipairs(window) do
        if not sent[entry] then kept[#kept + 1] = entry end
      end
      if #kept < #window then
        redis.call('LPOP', KEYS[1], #window)
        for i = #kept, 1, -1 do redis.call('LPUSH', KEYS[1], kept[i]) end
      end
    end
  end
  if redis.call('LLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
end
for i = 4 + given, #ARGV do
  redis.call('HDEL', KEYS[3], ARGV[i])
  redis.call('HDEL', KEYS[4], ARGV[i])
  redis.call('ZREM', KEYS[5], 'rep:' .. ARGV[i])
end
return exact
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


class SendQueues:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._release_due = redis.register_script(_RELEASE_DUE)
        self._sent = redis.register_script(_SENT)
        # Senders of many peers end their sends at about the same time.
        self._sent_together = SharedRoundTrips(redis)

    async def pending_destinations(self) -> list[int]:
        """Destinations whose send queue is not empty (what a previous run left to send)."""
        return sorted(int(as_text(d)) for d in await self.redis.smembers(keys.DESTINATIONS))

    async def send_queue_heads(self, dst: int, count: int) -> list[str]:
        """The first ``count`` entries (``req:<uid>`` or ``rep:<key>``) of ``dst``'s send queue."""
        return [as_text(e) for e in await self.redis.lrange(keys.send_queue(dst), 0, count - 1)]

    async def send_queue_range(self, dst: int, start: int, count: int) -> list[str]:
        """``count`` entries of ``dst``'s send queue from index ``start``."""
        return [as_text(e) for e in await self.redis.lrange(keys.send_queue(dst), start, start + count - 1)]

    async def send_queue_length(self, dst: int) -> int:
        return int(await self.redis.llen(keys.send_queue(dst)))

    # --- messages waiting for a peer that is down --------------------------------------------------------

    async def add_give_ups(self, dst: int, times: dict[str, float]) -> None:
        """When each of these send-queue entries gives up waiting for ``dst`` (entries already there keep
        their time)."""
        if times:
            await self.redis.zadd(keys.give_up(dst), times, nx=True)

    async def first_give_up(self, dst: int) -> float | None:
        """When the first of ``dst``'s waiting messages gives up, if any has a time."""
        first = await self.redis.zrange(keys.give_up(dst), 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def due_give_ups(self, dst: int, now: float, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(keys.give_up(dst), "-inf", now, start=0, num=limit)
        return [as_text(m) for m in found]

    async def drop_give_ups(self, dst: int, entries: Sequence[str]) -> None:
        if entries:
            await self.redis.zrem(keys.give_up(dst), *entries)

    async def forget_give_ups(self, dst: int) -> None:
        """``dst`` answers again: nothing waiting for it gives up any more."""
        # A peer back after a long absence may have a million of them: freed off the main thread.
        await self.redis.unlink(keys.give_up(dst))

    async def sent(
        self,
        dst: int,
        replies: Sequence[str],
        *,
        exact: Sequence[str] = (),
        head: tuple[str, int] | None = None,
    ) -> bool:
        """After a send to ``dst``, in one round trip: forget the ``replies`` (keys) the peer now has, and
        take what was sent out of the send queue: the entries ``exact`` (sent from memory; taken out wherever
        they are near the head), or ``head``'s count of entries if the queue still starts with ``head``'s
        first. False if the queue did not start with exactly that (memory was not in step with it)."""
        if head is not None:
            pop: list[Any] = ["head", head[1], head[0]] if head[1] else ["head", 0]
        else:
            pop = ["exact", len(exact), *exact]
        if pop[1] == 0 and not replies:
            return True
        script_keys = [keys.send_queue(dst), keys.DESTINATIONS, keys.REPLIES, keys.REPLY_STATE, keys.OUTBOX]
        (exact_head,) = await self._sent_together.run([(self._sent, script_keys, [dst, *pop, *replies])])
        return bool(exact_head)

    async def release_due(self, now: float, limit: int) -> list[str]:
        """Move up to ``limit`` re-sends due by ``now`` to their send queues; returns them."""
        members = await self._release_due(
            keys=[keys.OUTBOX, keys.DESTINATIONS], args=[now, limit, keys.SEND_QUEUE_PREFIX]
        )
        return [as_text(m) for m in members]
