"""The Redis scripts behind every hand-off, against a real Redis: atomic, and harmless when repeated."""

from __future__ import annotations

import json
import time

import redis.asyncio as aioredis

from msgbusd.store.queues import (
    REPLY_KEY_TAKEN,
    REPLY_QUEUED,
    REPLY_TAKEN_BEFORE,
    AcceptedRequest,
    Inbound,
    Outcome,
    PendingReply,
    Queued,
    Store,
)
from wire import keys
from wire.reliable_list import ReliableList


async def taken(redis: aioredis.Redis, queue: str, count: int) -> list[bytes]:
    """Take ``count`` items of a system queue into its processing list, as the daemon does."""
    return await ReliableList(redis, queue, keys.processing(queue), oldest="LEFT").take_now(count)


async def test_a_hand_over_repeated_after_a_lost_answer_happens_once(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.REMOTE, b"req")
    (raw,) = await taken(async_redis, keys.REMOTE, 1)
    item = (raw, keys.command_queue("x"), raw)
    assert await store.hand_over_many(keys.REMOTE, [item]) == [True]
    assert await store.hand_over_many(keys.REMOTE, [item]) == [False]
    assert await async_redis.lrange(keys.command_queue("x"), 0, -1) == [b"req"]
    assert await async_redis.llen(keys.processing(keys.REMOTE)) == 0


async def test_a_request_is_accepted_once_and_queued_for_each_destination(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await async_redis.set(keys.uid_counter(3), 41)
    await async_redis.rpush(keys.LOCAL, b"req")
    (raw,) = await taken(async_redis, keys.LOCAL, 1)
    request = AcceptedRequest(raw, b"original", 123.0, [2, 3])
    await async_redis.rpush(keys.send_queue(3), b"req:3.41")
    assert await store.accept_requests([request]) == [Queued(["2.1", "3.42"], [1, 2])]
    assert await store.accept_requests([request]) == [None]
    assert await async_redis.hgetall(keys.BACKLOG) == {b"2.1": b"original", b"3.42": b"original"}
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"req:2.1"]
    assert await async_redis.lrange(keys.send_queue(3), 0, -1) == [b"req:3.41", b"req:3.42"]
    deadlines = await async_redis.zrange(keys.DEADLINES, 0, -1, withscores=True)
    assert deadlines == [(b"2.1", 123.0), (b"3.42", 123.0)]
    assert await store.pending_destinations() == [2, 3]


async def test_a_reply_is_recorded_once_and_a_second_one_for_the_same_uid_goes_to_the_dead_letters(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.REPLY, b"first", b"second")
    first, second = await taken(async_redis, keys.REPLY, 2)
    state = {"first": 1.0, "attempts": 0, "deadline": 61.0}
    replies = [PendingReply(first, 2, "2|u", b"one", state), PendingReply(second, 2, "2|u", b"two", state)]
    assert await store.accept_replies(keys.REPLY, replies) == [REPLY_QUEUED, REPLY_KEY_TAKEN]
    # Repeated after a lost answer: neither is recorded or dead-lettered twice.
    assert await store.accept_replies(keys.REPLY, replies) == [REPLY_TAKEN_BEFORE, REPLY_TAKEN_BEFORE]
    assert await async_redis.hget(keys.REPLIES, "2|u") == b"one"
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"rep:2|u"]
    assert await async_redis.llen(keys.processing(keys.REPLY)) == 0
    (letter,) = [json.loads(raw) for raw in await async_redis.lrange(keys.DEAD_LETTER, 0, -1)]
    assert (letter["queue"], letter["raw"]) == (keys.REPLY, "second")
    assert letter["reason"] == "a reply to twin 2 for uid 'u' is already waiting to be forwarded"
    assert abs(letter["at"] - time.time()) < 60


async def test_batched_scripts_survive_a_script_flush(async_redis: aioredis.Redis) -> None:
    """A restarted Redis has no scripts: a batch loads them again and runs each call once."""
    store = Store(async_redis)
    await async_redis.rpush(keys.REMOTE, b"a", b"b")
    first, second = await taken(async_redis, keys.REMOTE, 2)
    await async_redis.script_flush()
    items = [(first, "svc", b"A"), (second, "svc", b"B")]
    assert await store.hand_over_many(keys.REMOTE, items) == [True, True]
    assert await async_redis.lrange("svc", 0, -1) == [b"B", b"A"]
    assert await async_redis.llen(keys.processing(keys.REMOTE)) == 0


async def test_sent_takes_out_what_was_sent_and_says_whether_the_queue_started_with_exactly_it(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    queue = keys.send_queue(2)
    await async_redis.rpush(queue, "req:a", "req:b", "req:c", "req:d", "req:e", "req:f")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    assert await store.sent(2, [], exact=["req:a", "req:b"]) is True
    assert await async_redis.lrange(queue, 0, -1) == [b"req:c", b"req:d", b"req:e", b"req:f"]
    # Sent in another order, or ahead of an entry memory did not have: taken out, the rest keeps its order.
    assert await store.sent(2, [], exact=["req:d", "req:c"]) is False
    assert await async_redis.lrange(queue, 0, -1) == [b"req:e", b"req:f"]
    assert await store.sent(2, [], exact=["req:f"]) is False
    assert await async_redis.lrange(queue, 0, -1) == [b"req:e"]
    # Already gone (sent from the queue before the word of it came): nothing else is touched.
    assert await store.sent(2, [], exact=["req:x"]) is False
    assert await async_redis.lrange(queue, 0, -1) == [b"req:e"]
    assert await store.pending_destinations() == [2]
    assert await store.sent(2, [], exact=["req:e"]) is True
    assert await store.pending_destinations() == []


async def test_sent_looks_for_what_was_sent_only_near_the_head(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    queue = keys.send_queue(2)
    await async_redis.rpush(queue, "req:a", "req:b", "req:c", "req:d", "req:e")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    assert await store.sent(2, [], exact=["req:e", "req:b"]) is False
    assert await async_redis.lrange(queue, 0, -1) == [b"req:a", b"req:c", b"req:d", b"req:e"]


async def test_sent_around_large_messages_on_their_way_leaves_them_where_they_are(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    queue = keys.send_queue(2)
    await async_redis.rpush(queue, "req:big1", "req:a", "req:big2", "req:b", "req:c", "req:d")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    # The queue starts with exactly what was sent, apart from the large messages still on their way.
    assert await store.sent(2, [], exact=["req:a", "req:b"], ahead=["req:big2", "req:big1"]) is True
    assert await async_redis.lrange(queue, 0, -1) == [b"req:big1", b"req:big2", b"req:c", b"req:d"]
    # Not in step (req:c was not sent): req:d is still taken out, the rest keeps its order.
    assert await store.sent(2, [], exact=["req:d"], ahead=["req:big1", "req:big2"]) is False
    assert await async_redis.lrange(queue, 0, -1) == [b"req:big1", b"req:big2", b"req:c"]
    # A large message that got through is taken out wherever it is.
    assert await store.sent(2, [], remove=["req:big2"]) is True
    assert await async_redis.lrange(queue, 0, -1) == [b"req:big1", b"req:c"]
    assert await store.sent(2, [], remove=["req:c", "req:big1"]) is True
    assert await store.pending_destinations() == []


async def test_a_large_message_queued_after_the_batch_sent_does_not_put_it_out_of_step(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    queue = keys.send_queue(2)
    # A large reply (rep:big) was queued after the small requests of the batch, and is on its way.
    await async_redis.rpush(queue, "req:big", "req:a", "req:b", "req:c", "req:d", "rep:big", "req:e")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    assert await store.sent(2, [], exact=["req:a", "req:b"], ahead=["req:big", "rep:big"]) is True
    assert await async_redis.lrange(queue, 0, -1) == [
        b"req:big", b"req:c", b"req:d", b"rep:big", b"req:e"
    ]  # fmt: skip


async def test_awaited_answers_name_each_twin_with_its_last_deadline_not_expired(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await async_redis.zadd(
        keys.DEADLINES, {"2.1": 100.0, "2.2": 300.0, "3.1": 50.0, "3.2": 250.0, "4.9": 20.0, "odd": 500.0}
    )
    # Twin 4's only request expired; read in pages smaller than the set.
    assert await store.awaited_answers(now=40.0, page=2) == {2: 300.0, 3: 250.0}


async def test_sent_pops_a_head_that_still_starts_with_the_first_entry(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.send_queue(2), "req:a", "req:b", "req:c")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    assert await store.sent(2, [], head=("req:b", 2)) is False
    assert await store.sent(2, [], head=("req:a", 2)) is True
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"req:c"]
    assert await store.sent(2, [], head=("req:c", 0)) is True
    assert await store.pending_destinations() == [2]
    assert await store.sent(2, [], head=("req:c", 5)) is True
    assert await store.pending_destinations() == []


async def test_sent_forgets_the_replies_the_peer_took_whatever_the_head(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.send_queue(2), "rep:2|x", "rep:2|y")
    await async_redis.sadd(keys.DESTINATIONS, 2)
    for key in ("2|x", "2|y"):
        await async_redis.hset(keys.REPLIES, key, b"payload")
        await async_redis.hset(keys.REPLY_STATE, key, b"{}")
        await async_redis.zadd(keys.OUTBOX, {"rep:" + key: 1.0})
    # The head was not what was sent: the reply the peer took is forgotten all the same.
    assert await store.sent(2, ["2|y"], exact=["rep:2|y"]) is False
    assert await async_redis.hkeys(keys.REPLIES) == [b"2|x"]
    assert await async_redis.hkeys(keys.REPLY_STATE) == [b"2|x"]
    assert await async_redis.zrange(keys.OUTBOX, 0, -1) == [b"rep:2|x"]
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"rep:2|x"]
    assert await store.sent(2, ["2|x"], head=("rep:2|y", 1)) is False
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"rep:2|x"]
    assert await async_redis.hlen(keys.REPLIES) == 0


async def test_only_the_first_outcome_of_a_request_reaches_its_caller(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.hset(keys.BACKLOG, "2.1", b"original")
    await async_redis.zadd(keys.DEADLINES, {"2.1": 1.0})
    first = Outcome("2.1", "caller-ret", b"reply")
    late = Outcome("2.1", "caller-ret", b"timeout")
    assert await store.finish_many([first, late]) == [1.0, None], "the first gets the deadline back"
    assert await async_redis.lrange("caller-ret", 0, -1) == [b"reply"]
    assert 0 < await async_redis.ttl("caller-ret") <= keys.RETURN_QUEUE_TTL_S
    assert await async_redis.zcard(keys.DEADLINES) == 0


async def test_a_resent_request_from_a_peer_is_queued_once(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    item = Inbound(keys.command_queue("cmd"), b"req", src=7, seen_id="1.5.abc", ttl_s=60, to_service=True)
    assert await store.queue_from_peers([item, item]) == [True, False]
    assert await async_redis.lrange(keys.command_queue("cmd"), 0, -1) == [b"req"]


async def test_due_re_sends_move_to_the_tail_of_their_send_queues(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.send_queue(2), "req:2.1")
    await async_redis.zadd(keys.OUTBOX, {"req:2.7": 10.0, "rep:3|5.1": 11.0, "req:2.8": 30.0, "junk": 12.0})
    moved = await store.release_due(now=20.0, limit=10)
    assert sorted(moved) == ["junk", "rep:3|5.1", "req:2.7"]
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"req:2.1", b"req:2.7"]
    assert await async_redis.lrange(keys.send_queue(3), 0, -1) == [b"rep:3|5.1"]
    assert await store.pending_destinations() == [2, 3]
    # Not due yet: stays scheduled.
    assert await async_redis.zrange(keys.OUTBOX, 0, -1) == [b"req:2.8"]


async def test_give_up_times_are_written_once_and_dropped_when_the_peer_is_back(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await store.add_give_ups(2, {"req:2.1": 10.0, "req:2.2": 50.0})
    await store.add_give_ups(2, {"req:2.1": 99.0})
    assert await store.due_give_ups(2, now=20.0, limit=10) == ["req:2.1"]
    await store.drop_give_ups(2, ["req:2.1"])
    assert await store.due_give_ups(2, now=60.0, limit=10) == ["req:2.2"]
    await store.forget_give_ups(2)
    assert await store.due_give_ups(2, now=60.0, limit=10) == []


async def test_failures_are_counted_only_for_requests_without_an_outcome(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.hset(keys.BACKLOG, "2.1", b"{}")
    assert await store.record_failures(["2.1", "2.9"]) == [1, 0]
    assert await store.record_failures(["2.1"], only_first=True) == [1]
    assert await store.record_failure("2.1") == 2
    # 2.9 has its outcome (no backlog entry): nothing is left behind for it.
    assert await async_redis.hgetall(keys.ATTEMPTS) == {b"2.1": b"2"}


async def test_entries_load_in_their_order_whatever_mixes_them(async_redis: aioredis.Redis) -> None:
    store = Store(async_redis)
    await async_redis.hset(keys.BACKLOG, mapping={"2.1": b"req 1", "2.3": b"req 3"})
    await async_redis.hset(keys.ATTEMPTS, "2.3", 2)
    await async_redis.hset(keys.REPLIES, mapping={"r1": b"reply 1", "r2": b"reply 2"})
    await async_redis.hset(keys.REPLY_STATE, "r2", b"state 2")
    req, rep = keys.REQUEST_PREFIX, keys.REPLY_PREFIX
    entries = [req + "2.1", rep + "r1", req + "2.2", rep + "r2", req + "2.3", rep + "r9"]
    assert await store.load_entries(entries) == [
        (b"req 1", None),
        (b"reply 1", None),
        (None, None),
        (b"reply 2", b"state 2"),
        (b"req 3", None),
        (None, None),
    ]
    assert await store.load_entries(entries, attempts=True) == [
        (b"req 1", None),
        (b"reply 1", None),
        (None, None),
        (b"reply 2", b"state 2"),
        (b"req 3", b"2"),
        (None, None),
    ]
    assert await store.load_entries([req + "2.3"], attempts=True) == [(b"req 3", b"2")]
    assert await store.load_entries([rep + "r2"]) == [(b"reply 2", b"state 2")]
    assert await store.load_entries([]) == []


async def test_a_staged_request_moved_back_to_the_queue_is_accepted_from_there(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await store.stage_local([b"made inside"])
    # The queue's taker started again meanwhile and took its processing list back.
    await ReliableList(async_redis, keys.LOCAL, keys.processing(keys.LOCAL), oldest="LEFT").take_back()
    assert await async_redis.lrange(keys.LOCAL, 0, -1) == [b"made inside"]
    taken_back = AcceptedRequest(b"made inside", b"original", 123.0, [2], staged=True)
    assert await store.accept_requests([taken_back]) == [Queued(["2.1"], [1])]
    assert await async_redis.llen(keys.LOCAL) == 0
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"req:2.1"]
    # Once accepted, it is not accepted again; and an item taken from the queue is only looked for where
    # its taker put it.
    assert await store.accept_requests([taken_back]) == [None]
    await async_redis.rpush(keys.LOCAL, b"pushed by a client")
    pushed = AcceptedRequest(b"pushed by a client", b"original", 123.0, [2])
    assert await store.accept_requests([pushed]) == [None]
    assert await async_redis.lrange(keys.LOCAL, 0, -1) == [b"pushed by a client"]


async def test_requests_past_their_deadline_are_counted_until_they_have_an_outcome(
    async_redis: aioredis.Redis,
) -> None:
    store = Store(async_redis)
    await async_redis.rpush(keys.LOCAL, b"req")
    (raw,) = await taken(async_redis, keys.LOCAL, 1)
    (queued,) = await store.accept_requests([AcceptedRequest(raw, b"original", 123.0, [2])])
    assert queued is not None
    (uid,) = queued.uids
    assert (await store.overdue(122.9), await store.overdue(123.0)) == (0, 1)
    assert await store.finish(uid, "ret", b"reply")
    assert await store.overdue(200.0) == 0
