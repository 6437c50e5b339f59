"""All of msgbusd's Redis I/O but the taking itself: atomic hand-offs, the backlog, the send queues, timers.

Items are taken from the system queues into their processing lists by :mod:`wire.reliable_list`. Each
hand-off is one Lua script that starts by removing the item from the processing list and does nothing if it
was not there, so a hand-off retried after a lost Redis answer cannot happen twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from msgbusd.store.replication import Replication
from msgbusd.store.script_batch import ScriptBatch
from msgbusd.store.send_queues import SendQueues
from msgbusd.store.shared_round_trips import SharedRoundTrips
from wire import keys
from wire.envelope import Envelope
from wire.redis_url import as_text

# KEYS: processing, target. ARGV: raw item, payload, ttl seconds (0 = none).
_HAND_OVER = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[2], ARGV[3]) end
return 1
"""

# KEYS: processing, dead-letter list. ARGV: raw item, record, max kept.
_DEAD_LETTER = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""

# Gives the request a uid per destination ("<dst>.<n>", n from INCR of that destination's counter) and
# returns them, and the length of each destination's send queue after it. A request staged by the daemon
# itself (ARGV[4] = '1') may have been moved back to the queue meanwhile (the queue's taker starting again
# takes its processing list back): it is taken from there.
# KEYS: processing, backlog, deadlines, destinations set, the queue, then (counter, send queue) per
# destination.
# ARGV: raw item, original request, deadline, staged ('1' or '0'), then the destinations.
_ACCEPT_REQUEST = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  if ARGV[4] ~= '1' or redis.call('LREM', KEYS[5], 1, ARGV[1]) == 0 then return 0 end
end
local uids, lengths = {}, {}
for i = 5, #ARGV do
  local dst = ARGV[i]
  local uid = dst .. '.' .. redis.call('INCR', KEYS[6 + (i - 5) * 2])
  redis.call('HSET', KEYS[2], uid, ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[3], uid)
  lengths[#lengths + 1] = redis.call('RPUSH', KEYS[7 + (i - 5) * 2], 'req:' .. uid)
  redis.call('SADD', KEYS[4], dst)
  uids[#uids + 1] = uid
end
return {uids, lengths}
"""

# Drops a request that has already failed at least once (its peer did not take it) and is not finished:
# its send-queue entry, if any, is skipped by the sender once the backlog entry is gone.
# KEYS: backlog, deadlines, outbox, attempts. ARGV: uid, outbox member.
_WITHDRAW = """
if tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') < 1 then return 0 end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""

# Records a reply to forward and acks its raw item; a second reply under the same key (twin and uid) while
# the first waits is dead-lettered instead (the caller's site takes one reply per request).
# KEYS: processing, replies, reply state, send queue, destinations set, dead letters.
# ARGV: raw item, key, payload, state, destination, queue, dead-letter reason, dead letters kept.
_ACCEPT_REPLY = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then
  local now = redis.call('TIME')
  local letter = {queue = ARGV[6], reason = ARGV[7], raw = ARGV[1], at = now[1] + now[2] / 1000000}
  redis.call('LPUSH', KEYS[6], cjson.encode(letter))
  redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[8]) - 1)
  return 2
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
redis.call('RPUSH', KEYS[4], 'rep:' .. ARGV[2])
redis.call('SADD', KEYS[5], ARGV[5])
return 1
"""

# The receiving side of /zbus-remote: queue a request once per (source twin, uid, content).
# KEYS: seen marker, target list. ARGV: ttl seconds, payload, LPUSH (a service's list) or RPUSH.
_ACCEPT_REMOTE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  redis.call(ARGV[3], KEYS[2], ARGV[2])
  return 1
end
return 0
"""

# A relay queues a message for a twin it relays once per (source twin, what it is), as it stands (signed by
# its source); it is sent on like a reply, from the replies hash. Returns the send queue's length, or 0 for
# a message queued already.
# KEYS: seen marker, replies, reply state, send queue, destinations set.
# ARGV: ttl seconds, key, payload, state, destination.
_RELAY = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
redis.call('SADD', KEYS[5], ARGV[5])
return redis.call('RPUSH', KEYS[4], 'rep:' .. ARGV[2])
"""

# The single place where a request gets its final outcome. The HDEL on the backlog is the claim: whoever
# removes the entry delivers, everybody else (a late reply, a duplicate, the expiry timer) delivers nothing.
# Returns 0, or (delivered) the request's deadline, from which the caller tells how long it took.
# KEYS: backlog, deadlines, outbox, attempts, ret, processing list (or "" when the caller popped nothing).
# ARGV: uid, payload, ttl seconds (0 = none), outbox member, processed raw item (when KEYS[6] is set).
_FINISH = """
if KEYS[6] ~= '' then redis.call('LREM', KEYS[6], 1, ARGV[5]) end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
local deadline = redis.call('ZSCORE', KEYS[2], ARGV[1]) or '-1'
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('LPUSH', KEYS[5], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[5], ARGV[3]) end
return deadline
"""

# Counts a failed attempt of a request that has no outcome yet (ARGV[2] = 1: only if it had none); returns
# its failures. KEYS: backlog, attempts. ARGV: uid, only-first flag.
_COUNT_FAILURE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[2] == '1' then
  redis.call('HSETNX', KEYS[2], ARGV[1], 1)
  return tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
end
return redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
"""

# A retry is scheduled only for a request that has no outcome yet. KEYS: backlog, outbox.
# ARGV: uid, member, due time.
_SCHEDULE_RETRY = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return 1
"""


@dataclass(frozen=True)
class Inbound:
    """An envelope another site sent, for ``queue``; with a ``seen_id`` it is queued once per lifetime.

    A service's list is pushed on the left (services pop on the right: first in, first out); the daemon's
    own queues on the right (it pops on the left).
    """

    queue: str
    payload: bytes
    src: int = 0
    seen_id: str = ""
    ttl_s: int = 0
    to_service: bool = False
    # The decoded message, kept for the event log.
    envelope: Envelope | None = None

    @property
    def push(self) -> str:
        return "LPUSH" if self.to_service else "RPUSH"


@dataclass(frozen=True)
class AcceptedRequest:
    """A local request to record: its raw item, the backlog entry, its deadline and its destinations."""

    raw: bytes
    original: bytes
    deadline: float
    destinations: Sequence[int]
    # Made inside the daemon (:meth:`Store.stage_local`), not taken from the queue by its taker.
    staged: bool = False


@dataclass(frozen=True)
class Queued:
    """A local request recorded: its uid for each destination, in order, and the length of each
    destination's send queue just after."""

    uids: list[str]
    queue_lengths: list[int]


def _queued(found: Any) -> Queued | None:
    """What the request script answered: its uids and queue lengths, or 0 (accepted before)."""
    if not found:
        return None
    uids, lengths = found
    return Queued([as_text(uid) for uid in uids], [int(length) for length in lengths])


@dataclass(frozen=True)
class Outcome:
    """The final message of request ``uid`` for ``ret``; ``raw`` is the popped item it answers, if any."""

    uid: str
    ret: str
    payload: bytes
    raw: bytes = b""


@dataclass(frozen=True)
class PendingReply:
    """A service's reply to forward to twin ``dst``, from the popped item ``raw``."""

    raw: bytes
    dst: int
    key: str
    payload: bytes
    state: dict[str, float]


@dataclass(frozen=True)
class RelayedMessage:
    """A message for twin ``dst``, which this site relays: kept under ``key`` until sent on; ``seen`` marks
    it queued for ``ttl_s``."""

    dst: int
    key: str
    payload: bytes
    state: dict[str, float]
    seen: str
    ttl_s: int


# What recording a reply to forward did (see Store.accept_replies).
REPLY_TAKEN_BEFORE, REPLY_QUEUED, REPLY_KEY_TAKEN = 0, 1, 2


def already_waiting_text(key: str) -> str:
    """Why a reply under ``key`` (``<twin>|<uid>``) is dead-lettered while another waits under it."""
    dst, _, uid = key.partition("|")
    return f"a reply to twin {dst} for uid {uid!r} is already waiting to be forwarded"


def _letter(queue: str, raw: bytes, reason: str) -> str:
    return json.dumps(
        {"queue": queue, "reason": reason, "raw": raw.decode("utf-8", "replace"), "at": time.time()}
    )


def request_member(uid: str) -> str:
    return keys.REQUEST_PREFIX + uid


def reply_member(key: str) -> str:
    return keys.REPLY_PREFIX + key


class Store(SendQueues):
    """msgbusd's view of its Redis. Takes an open ``redis.asyncio.Redis``; never creates one."""

    def __init__(
        self, redis: aioredis.Redis, instance: str | None = None, replication: Replication | None = None
    ) -> None:
        super().__init__(redis)
        self.instance = instance
        # The hand-offs the daemon acknowledges (to a peer, or by removing a taken item) wait for this.
        self._replication = replication
        self._hand_over = redis.register_script(_HAND_OVER)
        self._dead_letter = redis.register_script(_DEAD_LETTER)
        self._accept_request = redis.register_script(_ACCEPT_REQUEST)
        self._withdraw = redis.register_script(_WITHDRAW)
        self._accept_reply = redis.register_script(_ACCEPT_REPLY)
        self._accept_remote = redis.register_script(_ACCEPT_REMOTE)
        self._relay = redis.register_script(_RELAY)
        self._finish = redis.register_script(_FINISH)
        # Replies from many peers arrive at about the same time.
        self._finished_together = SharedRoundTrips(redis, replication)
        # Many senders find their peers down at once (a cloud calling every node): their tries are counted
        # together.
        self._counted_together = SharedRoundTrips(redis)
        self._schedule_retry = redis.register_script(_SCHEDULE_RETRY)
        self._count_failure = redis.register_script(_COUNT_FAILURE)

    def processing(self, queue: str) -> str:
        """The processing list of the items this daemon instance took from ``queue`` (without an instance:
        the one list of a site of one process, as the rules router and older releases use)."""
        return keys.instance_processing(queue, self.instance) if self.instance else keys.processing(queue)

    # --- hand-offs of taken items --------------------------------------------------------------------

    async def hand_over_many(self, queue: str, items: Sequence[tuple[bytes, str, bytes]]) -> list[bool]:
        """For each ``(raw, target, payload)``: LPUSH ``payload`` onto ``target`` and ack ``raw``, atomically,
        all in one round trip; False for an item that had already been handed over."""
        batch = ScriptBatch(self.redis, self._replication)
        for raw, target, payload in items:
            batch.script(self._hand_over, [self.processing(queue), target], [raw, payload, 0])
        return [bool(done) for done in await batch.run()]

    async def dead_letter(self, queue: str, raw: bytes, reason: str) -> None:
        """Set aside an item popped from ``queue`` that cannot be handled, with the reason, and ack it."""
        await self._dead_letter(
            keys=[self.processing(queue), keys.DEAD_LETTER],
            args=[raw, _letter(queue, raw, reason), keys.DEAD_LETTER_MAX],
        )

    async def set_aside(self, queue: str, raw: bytes, reason: str) -> None:
        """Put a message the daemon gives up on (not a popped item) on the dead-letter list."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(keys.DEAD_LETTER, _letter(queue, raw, reason))
            pipe.ltrim(keys.DEAD_LETTER, 0, keys.DEAD_LETTER_MAX - 1)
            await pipe.execute()

    async def hand_to_caller(self, queue: str, raw: bytes, ret: str, payload: bytes) -> bool:
        """Hand ``payload`` to a caller's return queue and ack ``raw``, atomically; refreshes the queue's TTL
        (unless it is a system queue). False if ``raw`` had already been handed over."""
        ttl = 0 if keys.is_system_queue(ret) else keys.RETURN_QUEUE_TTL_S
        done = await self._hand_over(keys=[self.processing(queue), ret], args=[raw, payload, ttl])
        return bool(done)

    async def push(self, queue: str, payload: bytes) -> None:
        """RPUSH onto a system queue."""
        batch = ScriptBatch(self.redis, self._replication)
        batch.command("rpush", queue, payload)
        await batch.run()

    async def queue_from_peers(self, items: Sequence[Inbound]) -> list[bool]:
        """Queue what other sites sent, in one round trip; a request already accepted within its lifetime
        (same source twin and seen id) is not queued again (False)."""
        if not items:
            return []
        batch = ScriptBatch(self.redis, self._replication)
        for item in items:
            if item.seen_id:
                batch.script(
                    self._accept_remote,
                    [keys.seen(item.src, item.seen_id), item.queue],
                    [item.ttl_s, item.payload, item.push],
                )
            else:
                batch.command(item.push.lower(), item.queue, item.payload)
        return [bool(done) for done in await batch.run()]

    async def relay_many(self, items: Sequence[RelayedMessage]) -> list[int]:
        """Queue messages for twins this site relays, in one round trip; for each, its destination's send
        queue length after it, or 0 for one queued already (same source twin and seen id)."""
        batch = ScriptBatch(self.redis, self._replication)
        for item in items:
            script_keys = [
                item.seen,
                keys.REPLIES,
                keys.REPLY_STATE,
                keys.send_queue(item.dst),
                keys.DESTINATIONS,
            ]
            args: list[Any] = [item.ttl_s, item.key, item.payload, json.dumps(item.state), item.dst]
            batch.script(self._relay, script_keys, args)
        return [int(length) for length in await batch.run()]

    async def depths(self) -> dict[str, int]:
        """Items waiting in each system queue, in the backlog and in the dead-letter list, and the replies
        waiting to go back to other sites (at a relay, with the messages it holds for the twins it relays)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for queue in keys.SYSTEM_QUEUES:
                pipe.llen(queue)
            pipe.hlen(keys.BACKLOG)
            pipe.llen(keys.DEAD_LETTER)
            pipe.hlen(keys.REPLIES)
            counts = await pipe.execute()
        names = [*keys.SYSTEM_QUEUES, keys.BACKLOG, keys.DEAD_LETTER, keys.REPLIES]
        return {name: int(count) for name, count in zip(names, counts, strict=True)}

    async def overdue(self, now: float) -> int:
        """Requests whose deadline is at or before ``now`` and that have no outcome yet."""
        return int(await self.redis.zcount(keys.DEADLINES, "-inf", now))

    async def read_list(self, key: str) -> list[bytes]:
        return cast(list[bytes], await self.redis.lrange(key, 0, -1))

    # --- requests: uids, backlog, deadlines -------------------------------------------------

    async def accept_requests(self, requests: Sequence[AcceptedRequest]) -> list[Queued | None]:
        """Record each local request for each of its destinations (uid, backlog, deadline, send queue) and
        ack its raw item, atomically per request, in one round trip. Returns each request's uids and send
        queue lengths, in the order of its destinations, or None for one that had already been accepted."""
        batch = ScriptBatch(self.redis, self._replication)
        for request in requests:
            script_keys = [
                self.processing(keys.LOCAL),
                keys.BACKLOG,
                keys.DEADLINES,
                keys.DESTINATIONS,
                keys.LOCAL,
            ]
            for dst in request.destinations:
                script_keys += [keys.uid_counter(dst), keys.send_queue(dst)]
            staged = "1" if request.staged else "0"
            args: list[Any] = [request.raw, request.original, request.deadline, staged, *request.destinations]
            batch.script(self._accept_request, script_keys, args)
        return [_queued(found) for found in await batch.run()]

    async def load_entries(
        self, entries: Sequence[str], *, attempts: bool = False
    ) -> list[tuple[bytes | None, bytes | None]]:
        """For each send-queue entry, in one round trip: (payload, state) of a reply, and (backlog entry,
        None) of a request, or with ``attempts`` (backlog entry, its failed attempts so far or None)."""
        replies = [
            entry.removeprefix(keys.REPLY_PREFIX) for entry in entries if entry.startswith(keys.REPLY_PREFIX)
        ]
        requests = [
            entry.removeprefix(keys.REQUEST_PREFIX)
            for entry in entries
            if not entry.startswith(keys.REPLY_PREFIX)
        ]
        # A few HMGETs rather than an HGET per entry: a sender reads up to a batch of entries at a time.
        fields: list[tuple[str, list[str]]] = [(keys.REPLIES, replies), (keys.REPLY_STATE, replies)]
        fields += [(keys.BACKLOG, requests), *([(keys.ATTEMPTS, requests)] if attempts else [])]
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, names in fields:
                if names:
                    pipe.hmget(key, names)
            found = iter(await pipe.execute())
        columns = [iter(next(found) if names else ()) for _key, names in fields]
        payloads, states, backlog = columns[:3]
        failures = columns[3] if attempts else iter(())
        return [
            (next(payloads), next(states))
            if entry.startswith(keys.REPLY_PREFIX)
            else (next(backlog), next(failures) if attempts else None)
            for entry in entries
        ]

    async def record_failure(self, uid: str) -> int:
        """Count a failed attempt of request ``uid``; returns the failures so far."""
        (failures,) = await self.record_failures([uid])
        return failures

    async def record_failures(self, uids: Sequence[str], *, only_first: bool = False) -> list[int]:
        """Count a failed attempt of each request (with ``only_first``, of those that had none yet), in one
        round trip; returns each one's failures so far. A request that has its outcome by now is left alone
        (its bookkeeping is gone and stays gone)."""
        calls = [(self._count_failure, [keys.BACKLOG, keys.ATTEMPTS], [uid, int(only_first)]) for uid in uids]
        return [int(n) for n in await self._counted_together.run(calls)]

    async def schedule_retry(self, uid: str, due: float) -> bool:
        """Schedule a re-send of request ``uid``; False if it already has its outcome."""
        done = await self._schedule_retry(
            keys=[keys.BACKLOG, keys.OUTBOX], args=[uid, request_member(uid), due]
        )
        return bool(done)

    async def due_deadlines(self, now: float, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(keys.DEADLINES, "-inf", now, start=0, num=limit)
        return [as_text(m) for m in found]

    async def finish(self, uid: str, ret: str, payload: bytes) -> bool:
        """Deliver the final outcome of request ``uid`` to ``ret``; False if it already had one."""
        (deadline,) = await self.finish_many([Outcome(uid, ret, payload)])
        return deadline is not None

    async def finish_many(
        self, outcomes: Sequence[Outcome], ack_queue: str | None = None
    ) -> list[float | None]:
        """:meth:`finish` for many outcomes at once, in one round trip; with ``ack_queue``, each outcome's
        raw item is acked from that queue's processing list whether it was delivered or not. For each
        outcome delivered, the request's deadline (unix seconds; -1 if it had none); None for the others."""
        processing = self.processing(ack_queue) if ack_queue else ""
        calls = []
        for outcome in outcomes:
            ttl = 0 if keys.is_system_queue(outcome.ret) else keys.RETURN_QUEUE_TTL_S
            script_keys = [keys.BACKLOG, keys.DEADLINES, keys.OUTBOX, keys.ATTEMPTS, outcome.ret, processing]
            args = [outcome.uid, outcome.payload, ttl, request_member(outcome.uid), outcome.raw]
            calls.append((self._finish, script_keys, args))
        answers = await self._finished_together.run(calls)
        return [None if answer == 0 else float(answer) for answer in answers]

    async def stage_local(self, raws: Sequence[bytes]) -> None:
        """Put requests made inside the daemon where taken local requests wait for acceptance, so that
        they are accepted by the same script (and recovered like them after a crash)."""
        await self.redis.rpush(self.processing(keys.LOCAL), *raws)

    async def withdraw(self, uid: str) -> bool:
        """Drop request ``uid`` if its destination has failed to take it at least once and it has no
        outcome yet; True if it was dropped (no reply or error will come for it)."""
        return bool(
            await self._withdraw(
                keys=[keys.BACKLOG, keys.DEADLINES, keys.OUTBOX, keys.ATTEMPTS],
                args=[uid, request_member(uid)],
            )
        )

    async def forget_request(self, uid: str) -> None:
        """Drop a request and all its bookkeeping (used when its backlog entry is gone or unreadable)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.BACKLOG, uid)
            pipe.zrem(keys.DEADLINES, uid)
            pipe.zrem(keys.OUTBOX, request_member(uid))
            pipe.hdel(keys.ATTEMPTS, uid)
            await pipe.execute()

    # --- replies being forwarded to other sites ----------------------------------------------------------

    async def accept_replies(self, queue: str, replies: Sequence[PendingReply]) -> list[int]:
        """Record replies to forward (payload, state, send-queue entry) and ack each raw item, atomically per
        reply, in one round trip. Each one's result: :data:`REPLY_QUEUED`, :data:`REPLY_TAKEN_BEFORE` (an
        earlier try recorded it), or :data:`REPLY_KEY_TAKEN` (another reply to the same twin and uid waits to
        be forwarded: this one went to the dead letters, with :func:`already_waiting_text`)."""
        batch = ScriptBatch(self.redis, self._replication)
        for reply in replies:
            script_keys = [self.processing(queue), keys.REPLIES, keys.REPLY_STATE]
            script_keys += [keys.send_queue(reply.dst), keys.DESTINATIONS, keys.DEAD_LETTER]
            args: list[Any] = [reply.raw, reply.key, reply.payload, json.dumps(reply.state), reply.dst]
            args += [queue, already_waiting_text(reply.key), keys.DEAD_LETTER_MAX]
            batch.script(self._accept_reply, script_keys, args)
        return [int(result) for result in await batch.run()]

    async def schedule_reply(self, key: str, due: float) -> None:
        """Schedule the next attempt to forward reply ``key``."""
        await self.redis.zadd(keys.OUTBOX, {reply_member(key): due})

    async def update_reply_state(self, key: str, state: dict[str, float]) -> None:
        await self.redis.hset(keys.REPLY_STATE, key, json.dumps(state))

    async def forget_reply(self, key: str) -> None:
        await self.forget_replies([key])

    async def forget_replies(self, reply_keys: Sequence[str]) -> None:
        """Drop replies that were forwarded (or given up), with their state and outbox entries."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.REPLIES, *reply_keys)
            pipe.hdel(keys.REPLY_STATE, *reply_keys)
            pipe.zrem(keys.OUTBOX, *(reply_member(key) for key in reply_keys))
            await pipe.execute()
