"""Taking from a Redis list without losing an item, against a real Redis, from either end."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from wire.backoff import Backoff
from wire.reliable_list import End, ReliableList, consume_in_order

QUEUE = "test.queue"
PROCESSING = "test.queue.processing"
NO_WAIT = Backoff(base_s=0.0, max_s=0.0)


async def push_oldest_first(redis: aioredis.Redis, oldest: End, *items: bytes) -> None:
    """Push as a producer does: onto the end opposite to ``oldest``."""
    for item in items:
        await (redis.rpush(QUEUE, item) if oldest == "LEFT" else redis.lpush(QUEUE, item))


@pytest.mark.parametrize("oldest", ["LEFT", "RIGHT"])
async def test_items_are_taken_oldest_first_and_put_back_in_order(
    async_redis: aioredis.Redis, oldest: End
) -> None:
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest=oldest)
    await push_oldest_first(async_redis, oldest, b"a", b"b", b"c", b"d", b"e")
    assert await source.take(1, 0.1) == [b"a"]
    assert await source.take(2, 0.1) == [b"b", b"c"]
    assert await source.take_now(1) == [b"d"]
    assert await async_redis.llen(PROCESSING) == 4
    assert await source.take_back() == 4
    assert await async_redis.llen(PROCESSING) == 0
    assert await source.take_now(10) == [b"a", b"b", b"c", b"d", b"e"]
    assert await source.take_now(10) == []
    assert await source.take_now(1) == []


async def test_take_waits_for_the_first_item_and_returns_nothing_when_none_comes(
    async_redis: aioredis.Redis,
) -> None:
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="LEFT")
    assert await source.take(5, 0.05) == []
    waiting = asyncio.create_task(source.take(5, 5.0))
    await asyncio.sleep(0.05)
    await async_redis.rpush(QUEUE, b"late")
    async with asyncio.timeout(5):
        assert await waiting == [b"late"]


async def test_an_acknowledged_item_is_not_taken_back(async_redis: aioredis.Redis) -> None:
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="LEFT")
    await async_redis.rpush(QUEUE, b"a", b"b")
    first, _ = await source.take_now(2)
    await source.ack([first])
    await source.ack([first])  # repeated after a lost answer: removes nothing more
    assert await source.take_back() == 1
    assert await async_redis.lrange(QUEUE, 0, -1) == [b"b"]


async def test_take_survives_a_script_flush(async_redis: aioredis.Redis) -> None:
    """A restarted Redis has no scripts: the rest of a batch is taken with the script loaded again."""
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="LEFT")
    await async_redis.rpush(QUEUE, b"a", b"b", b"c")
    await async_redis.script_flush()
    assert await source.take(3, 0.1) == [b"a", b"b", b"c"]


async def test_a_batch_that_failed_is_taken_again_in_order(async_redis: aioredis.Redis) -> None:
    """What a handler did not acknowledge before it raised is put back at the head and handled next."""
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="LEFT")
    await async_redis.rpush(QUEUE, b"a", b"b", b"c")
    stopping = asyncio.Event()
    seen: list[list[bytes]] = []

    async def handle(batch: list[bytes]) -> None:
        seen.append(batch)
        await source.ack(batch[:1])
        if len(seen) == 1:
            raise RuntimeError("the handler failed after the first item")
        await source.ack(batch[1:])
        stopping.set()

    async with asyncio.timeout(10):
        await consume_in_order(source, handle, stopping, batch=10, block_s=0.05, retry=NO_WAIT)
    assert seen == [[b"a", b"b", b"c"], [b"b", b"c"]]
    assert await async_redis.llen(PROCESSING) == 0


async def test_the_consumer_takes_back_what_the_previous_one_left(async_redis: aioredis.Redis) -> None:
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="RIGHT")
    await async_redis.lpush(PROCESSING, b"left over")
    await async_redis.lpush(QUEUE, b"new")
    stopping = asyncio.Event()
    seen: list[bytes] = []
    turns = 0

    def turned() -> None:
        nonlocal turns
        turns += 1

    async def handle(batch: list[bytes]) -> None:
        seen.extend(batch)
        await source.ack(batch)
        stopping.set()

    async with asyncio.timeout(10):
        await consume_in_order(source, handle, stopping, batch=10, block_s=0.05, turned=turned)
    assert seen == [b"left over", b"new"]
    assert turns == 1


async def test_a_helping_consumer_takes_only_while_items_pile_up(async_redis: aioredis.Redis) -> None:
    source = ReliableList(async_redis, QUEUE, PROCESSING, oldest="LEFT")
    await async_redis.rpush(QUEUE, b"a", b"b")
    stopping = asyncio.Event()
    seen: list[list[bytes]] = []

    async def handle(batch: list[bytes]) -> None:
        seen.append(batch)
        await source.ack(batch)
        if await async_redis.llen(QUEUE) < 3:
            stopping.set()

    helping = asyncio.create_task(
        consume_in_order(source, handle, stopping, batch=2, block_s=0.01, behind=3, retry=NO_WAIT)
    )
    # Two waiting are not behind: left for the usual consumer.
    await asyncio.sleep(0.2)
    assert seen == [] and await async_redis.llen(QUEUE) == 2
    await async_redis.rpush(QUEUE, b"c", b"d")
    async with asyncio.timeout(10):
        await helping
    # Taken a batch at a time while three or more waited, oldest first.
    assert seen == [[b"a", b"b"]]
    assert await async_redis.lrange(QUEUE, 0, -1) == [b"c", b"d"]
    assert await async_redis.llen(PROCESSING) == 0
