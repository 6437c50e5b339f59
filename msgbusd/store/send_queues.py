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
# destination, a mode, then the keys of the replies to forget. The modes:
# - 'exact', n, k, the n entries sent, k entries that may lie among them (large messages still on their way):
#   the queue is expected to start with exactly the n, in order, apart from those k; the n are taken out of
#   the queue's first 2n + k entries, wherever they are, and the rest keeps its order;
# - 'head', n, one entry: pop n entries if the queue still starts with that one ('head', 0: pop none);
# - 'remove', n, the n entries: each taken out wherever it is (a large message sent beside the others).
# Returns 1 when the queue started with what was given ('remove': always), else 0.
_SENT = """
local mode, n = ARGV[2], tonumber(ARGV[3])
local exact, first_reply = 1, 4
if mode == 'head' then
  if n > 0 then
    first_reply = 5
    if redis.call('LINDEX', KEYS[1], 0) == ARGV[4] then redis.call('LPOP', KEYS[1], n) else exact = 0 end
  end
elseif mode == 'remove' then
  first_reply = 4 + n
  for i = 1, n do redis.call('LREM', KEYS[1], 1, ARGV[3 + i]) end
else
  local k = tonumber(ARGV[4])
  first_reply = 5 + n + k
  if n > 0 then
    local window = redis.call('LRANGE', KEYS[1], 0, 2 * n + k - 1)
    local aside = {}
    for i = 1, k do aside[ARGV[4 + n + i]] = true end
    local matched = 0
    for i = 1, #window do
      if matched == n then break end
      local entry = window[i]
      if not aside[entry] then
        matched = matched + 1
        if entry ~= ARGV[4 + matched] then exact = 0 end
      end
    end
    if matched ~= n then exact = 0 end
    local sent = {}
    for i = 1, n do sent[ARGV[4 + i]] = true end
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
if n > 0 and redis.call('LLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
for i = first_reply, #ARGV do
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

    async def awaited_answers(self, now: float, page: int = 10_000) -> dict[int, float]:
        """The twins that requests of this site not expired yet are for (sent or not), each with the latest
        of those requests' deadlines (unix time)."""
        awaited: dict[int, float] = {}
        start = 0
        while True:
            found = await self.redis.zrangebyscore(
                keys.DEADLINES, now, "+inf", start=start, num=page, withscores=True
            )
            for member in found:
                uid, deadline = member[0], member[1]
                # A uid is "<destination>.<n>".
                head, _, tail = as_text(uid).partition(".")
                if head.isdigit() and tail:
                    dst = int(head)
                    awaited[dst] = max(awaited.get(dst, 0.0), float(deadline))
            if len(found) < page:
                return awaited
            start += page

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
        ahead: Sequence[str] = (),
        head: tuple[str, int] | None = None,
        remove: Sequence[str] = (),
    ) -> bool:
        """After a send to ``dst``, in one round trip: forget the ``replies`` (keys) the peer now has, and
        take what was sent out of the send queue: the entries ``exact`` (taken out wherever they are near the
        head; the queue is expected to start with exactly these, apart from the entries ``ahead``, large
        messages still on their way), or ``head``'s count of entries if the queue still starts with ``head``'s
        first, or the entries ``remove`` wherever they are. False if the queue did not start with exactly
        that (memory was not in step with it)."""
        if head is not None:
            pop: list[Any] = ["head", head[1], head[0]] if head[1] else ["head", 0]
        elif remove:
            pop = ["remove", len(remove), *remove]
        else:
            pop = ["exact", len(exact), len(ahead) if exact else 0, *exact, *(ahead if exact else ())]
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
