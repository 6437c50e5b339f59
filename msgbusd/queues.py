"""All of msgbusd's Redis I/O: reliable pops, atomic hand-offs, the backlog, the outbox and the deadlines.

Every item popped from a queue is moved atomically into that queue's processing list and removed from there
only in the same MULTI/EXEC (or Lua script) that makes its hand-off durable. Whatever a killed daemon held is
moved back to the head of its queue at start-up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from msgbusd import keys

# Moves a processing list back to the head of its queue, keeping the original order.
_RECOVER = """
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') do
  moved = moved + 1
end
return moved
"""

# The single place where a request gets its final outcome. The HDEL on the backlog is the claim: whoever
# removes the entry delivers, everybody else (a late reply, a duplicate, the expiry timer) delivers nothing.
# KEYS: backlog, deadlines, outbox, attempts, ret, processing list (or "" when the caller popped nothing).
# ARGV: uid, payload, ttl seconds (0 = none), outbox member, processed raw item (when KEYS[6] is set).
_FINISH = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  if KEYS[6] ~= '' then redis.call('LREM', KEYS[6], 1, ARGV[5]) end
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('LPUSH', KEYS[5], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[5], ARGV[3]) end
if KEYS[6] ~= '' then redis.call('LREM', KEYS[6], 1, ARGV[5]) end
return 1
"""

# Claims the due members of the outbox by pushing their due time to the lease end.
# KEYS: outbox. ARGV: now, lease end, max count.
_CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], member)
end
return due
"""


@dataclass(frozen=True)
class PendingRequest:
    """One destination of an accepted local request: what the backlog, deadline and outbox record."""

    uid: str
    original: bytes
    deadline: float


def _item(raw: bytes) -> str:
    """redis-py's stubs type list values as str; raw bytes go over the wire unchanged."""
    return cast(str, raw)


def request_member(uid: str) -> str:
    return keys.REQUEST_PREFIX + uid


def reply_member(key: str) -> str:
    return keys.REPLY_PREFIX + key


class Store:
    """msgbusd's view of its Redis. Takes an open ``redis.asyncio.Redis``; never creates one."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._recover = redis.register_script(_RECOVER)
        self._finish = redis.register_script(_FINISH)
        self._claim_due = redis.register_script(_CLAIM_DUE)

    # --- reliable queues -------------------------------------------------------------------------------

    async def recover(self, queue: str) -> int:
        """Put back what a previous run left in ``queue``'s processing list; returns how many items."""
        return int(await self._recover(keys=[keys.processing(queue), queue]))

    async def pop(self, queue: str, block_s: float) -> bytes | None:
        """Move the head of ``queue`` into its processing list, waiting up to ``block_s``."""
        # redis-py types the timeout as int, but Redis takes (and sends) fractional seconds.
        item = await self.redis.blmove(queue, keys.processing(queue), cast(int, block_s), "LEFT", "RIGHT")
        return cast(bytes | None, item)

    async def ack(self, queue: str, raw: bytes) -> None:
        await self.redis.lrem(keys.processing(queue), 1, _item(raw))

    async def dead_letter(self, queue: str, raw: bytes, reason: str) -> None:
        """Keep an item that cannot be handled, with the reason, for an operator to look at."""
        record = json.dumps(
            {"queue": queue, "reason": reason, "raw": raw.decode("utf-8", "replace"), "at": time.time()}
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(keys.DEAD_LETTER, record)
            pipe.ltrim(keys.DEAD_LETTER, 0, keys.DEAD_LETTER_MAX - 1)
            pipe.lrem(keys.processing(queue), 1, _item(raw))
            await pipe.execute()

    async def hand_over(self, queue: str, raw: bytes, target: str, payload: bytes) -> None:
        """Push ``payload`` onto ``target`` and ack ``raw`` in one transaction."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(target, payload)
            pipe.lrem(keys.processing(queue), 1, _item(raw))
            await pipe.execute()

    async def push_to_return_queue(
        self, ret: str, payload: bytes, *, ack: tuple[str, bytes] | None = None
    ) -> None:
        """LPUSH to a client's return list and refresh its TTL (never on a system queue)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(ret, payload)
            if not keys.is_system_queue(ret):
                pipe.expire(ret, keys.RETURN_QUEUE_TTL_S)
            if ack is not None:
                pipe.lrem(keys.processing(ack[0]), 1, _item(ack[1]))
            await pipe.execute()

    async def push(self, queue: str, payload: bytes) -> None:
        """RPUSH onto a system queue (what the HTTP endpoints do)."""
        await self.redis.rpush(queue, payload)

    async def read_list(self, key: str) -> list[bytes]:
        return cast(list[bytes], await self.redis.lrange(key, 0, -1))

    # --- requests: uids, backlog, outbox, deadlines ------------------------------------------------------

    async def next_uids(self, destinations: Sequence[int]) -> list[str]:
        """One ``<dst>.<n>`` per destination, n from ``INCR msgbus.counter.<dst>``."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for dst in destinations:
                pipe.incr(keys.uid_counter(dst))
            counters = await pipe.execute()
        return [f"{dst}.{n}" for dst, n in zip(destinations, counters, strict=True)]

    async def accept_request(self, raw: bytes, pending: Sequence[PendingRequest], lease_until: float) -> None:
        """Record every destination (backlog, deadline, leased outbox entry) and ack the item, atomically."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for item in pending:
                pipe.hset(keys.BACKLOG, item.uid, item.original)
                pipe.zadd(keys.DEADLINES, {item.uid: item.deadline})
                pipe.zadd(keys.OUTBOX, {request_member(item.uid): lease_until})
            pipe.lrem(keys.processing(keys.LOCAL), 1, _item(raw))
            await pipe.execute()

    async def backlog_entry(self, uid: str) -> bytes | None:
        return cast(bytes | None, await self.redis.hget(keys.BACKLOG, uid))

    async def sent(self, member: str) -> None:
        """A send succeeded: forget its outbox entry."""
        await self.redis.zrem(keys.OUTBOX, member)

    async def record_failure(self, uid: str) -> int:
        """Count a failed attempt of request ``uid``; returns the failures so far."""
        return int(await self.redis.hincrby(keys.ATTEMPTS, uid, 1))

    async def failures(self, uid: str) -> int:
        value = await self.redis.hget(keys.ATTEMPTS, uid)
        return int(value) if value is not None else 0

    async def reschedule(self, member: str, due: float) -> bool:
        """Set the next due time of an outbox entry that still exists; False if it was finished meanwhile."""
        changed = await self.redis.zadd(keys.OUTBOX, {member: due}, xx=True, ch=True)
        return bool(changed) or await self.redis.zscore(keys.OUTBOX, member) is not None

    async def claim_due(self, now: float, lease_until: float, limit: int) -> list[str]:
        """Outbox members due by ``now``, leased until ``lease_until`` so no one else takes them."""
        members = await self._claim_due(keys=[keys.OUTBOX], args=[now, lease_until, limit])
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def due_deadlines(self, now: float, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(keys.DEADLINES, "-inf", now, start=0, num=limit)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in found]

    async def finish(
        self, uid: str, ret: str, payload: bytes, *, ack: tuple[str, bytes] | None = None
    ) -> bool:
        """Deliver the final outcome of request ``uid`` to ``ret``; False if it already had one."""
        ttl = 0 if keys.is_system_queue(ret) else keys.RETURN_QUEUE_TTL_S
        processing = keys.processing(ack[0]) if ack else ""
        raw: Any = ack[1] if ack else b""
        done = await self._finish(
            keys=[keys.BACKLOG, keys.DEADLINES, keys.OUTBOX, keys.ATTEMPTS, ret, processing],
            args=[uid, payload, ttl, request_member(uid), raw],
        )
        return bool(done)

    async def forget_request(self, uid: str) -> None:
        """Drop a request and all its bookkeeping (used when its backlog entry is gone or unreadable)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.BACKLOG, uid)
            pipe.zrem(keys.DEADLINES, uid)
            pipe.zrem(keys.OUTBOX, request_member(uid))
            pipe.hdel(keys.ATTEMPTS, uid)
            await pipe.execute()

    # --- replies being forwarded to other sites ----------------------------------------------------------

    async def accept_reply(
        self, queue: str, raw: bytes, key: str, payload: bytes, state: dict[str, float], lease_until: float
    ) -> None:
        """Record a reply to forward (payload, state, leased outbox entry) and ack ``raw`` from ``queue``."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.REPLIES, key, payload)
            pipe.hset(keys.REPLY_STATE, key, json.dumps(state))
            pipe.zadd(keys.OUTBOX, {reply_member(key): lease_until})
            pipe.lrem(keys.processing(queue), 1, _item(raw))
            await pipe.execute()

    async def pending_reply(self, key: str) -> tuple[bytes, dict[str, float]] | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.REPLIES, key)
            pipe.hget(keys.REPLY_STATE, key)
            payload, state = await pipe.execute()
        if payload is None:
            return None
        return payload, (json.loads(state) if state else {})

    async def update_reply_state(self, key: str, state: dict[str, float]) -> None:
        await self.redis.hset(keys.REPLY_STATE, key, json.dumps(state))

    async def forget_reply(self, key: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.REPLIES, key)
            pipe.hdel(keys.REPLY_STATE, key)
            pipe.zrem(keys.OUTBOX, reply_member(key))
            await pipe.execute()
