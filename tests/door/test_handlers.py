"""The handler of local requests, on a real Redis: which destinations' send queues hold nothing but what it
just queued (their new senders then send from memory at once, without reading the queue back)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import redis.asyncio as aioredis

from msgbusd.door.handlers import Handlers
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.queues import Store
from wire import keys
from wire.envelope import Envelope, encode_payload
from wire.reliable_list import ReliableList

Accepted = tuple[dict[int, list[SendItem] | None], set[int]]


def local_request(*destinations: int) -> bytes:
    env = Envelope(
        uid="", cmd="echo", dat=encode_payload(b"x"), src=0, dst=destinations, ret="caller.ret",
        now=int(time.time()), exp=60, retries=1,
    )  # fmt: skip
    return env.encode()


async def accept(redis: aioredis.Redis, *requests: bytes) -> Accepted:
    store = Store(redis)
    accepted: list[Accepted] = []

    def on_accepted(ready: Mapping[int, list[SendItem] | None], alone: set[int]) -> None:
        accepted.append((dict(ready), alone))

    handlers = Handlers(store, SendItems(store, 1), 1, on_accepted)
    await redis.rpush(keys.LOCAL, *requests)
    taken = await ReliableList(redis, keys.LOCAL, keys.processing(keys.LOCAL), oldest="LEFT").take_now(10)
    await handlers.local(taken)
    (only,) = accepted
    return only


async def test_destinations_with_nothing_else_queued_are_known_whole(async_redis: aioredis.Redis) -> None:
    # Twin 3 has a message waiting from before; twins 2 and 4 have none.
    await async_redis.rpush(keys.send_queue(3), b"req:3.1")
    ready, alone = await accept(async_redis, local_request(2, 3), local_request(2), local_request(4))
    assert {dst: len(items or []) for dst, items in ready.items()} == {2: 2, 3: 1, 4: 1}
    assert alone == {2, 4}
    queued = [await async_redis.lrange(keys.send_queue(dst), 0, -1) for dst in (2, 3, 4)]
    assert [len(entries) for entries in queued] == [2, 2, 1]


async def test_a_queue_that_is_not_empty_is_never_known_whole(async_redis: aioredis.Redis) -> None:
    await accept(async_redis, local_request(2))
    # The first request to twin 2 was not sent yet: the second is not alone in its queue.
    _, alone = await accept(async_redis, local_request(2))
    assert alone == set()
