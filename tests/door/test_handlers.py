"""The handler of local requests, on a real Redis: which destinations' send queues hold nothing but what it
just queued (their new senders then send from memory at once, without reading the queue back)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Literal

import redis.asyncio as aioredis

from msgbusd.door.handlers import Handlers
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.queues import AcceptedRequest, Queued, Store
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


class WatchedLock(asyncio.Lock):
    """A lock that tells when someone waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited_for = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.waited_for.set()
        return await super().acquire()


async def test_the_local_queue_is_not_taken_back_from_under_a_request_made_inside(
    async_redis: aioredis.Redis,
) -> None:
    # The local queue's taker starts again (as when this instance was taken for dead) while a request made
    # inside the daemon (the rules router's) waits in the processing list to be accepted.
    store = Store(async_redis)
    handlers = Handlers(store, SendItems(store, 1), 1, lambda ready, alone: None)
    handlers.staging = guard = WatchedLock()
    taker = ReliableList(
        async_redis, keys.LOCAL, store.processing(keys.LOCAL), oldest="LEFT", take_back_guard=guard
    )
    staged, accept_now = asyncio.Event(), asyncio.Event()
    accept_requests = store.accept_requests

    async def accept_once_told(requests: list[AcceptedRequest]) -> list[Queued | None]:
        if all(request.staged for request in requests):
            staged.set()
            await accept_now.wait()
        return await accept_requests(requests)

    store.accept_requests = accept_once_told  # type: ignore[method-assign]

    async def take_again() -> None:
        await taker.take_back()
        await handlers.local(await taker.take_now(10))

    submitting = asyncio.create_task(handlers.submit([Envelope.decode(local_request(2))]))
    await staged.wait()
    taking = asyncio.create_task(take_again())
    # The taker either waits for the guard or (without it) takes the request and accepts it itself.
    await asyncio.wait([taking, asyncio.create_task(guard.waited_for.wait())], return_when="FIRST_COMPLETED")
    accept_now.set()
    assert await submitting == [["2.1"]]
    await taking
    assert await async_redis.lrange(keys.send_queue(2), 0, -1) == [b"req:2.1"]
    assert await async_redis.llen(keys.LOCAL) == 0
