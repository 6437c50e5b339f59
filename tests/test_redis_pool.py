"""The daemon's bounded Redis pool (``wire.redis_pool``) against a real redis-server: commands beyond its
connections wait for one and all complete, a wait gives up after the pool's timeout with redis-py's error,
and a waiter that goes away does not keep the next one waiting."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from wire.redis_pool import QuickBlockingPool
from wire.redis_url import async_client


def client(redis_url: str, connections: int, timeout: float | None = None) -> aioredis.Redis:
    pool = QuickBlockingPool.from_url(redis_url, max_connections=connections, timeout=timeout)
    return aioredis.Redis.from_pool(pool)


async def test_commands_beyond_the_connections_wait_for_one_and_all_complete(redis_url: str) -> None:
    conn = client(redis_url, connections=3)
    key = f"pool-{uuid.uuid4()}"
    in_use: list[int] = []
    pool = conn.connection_pool

    async def one(n: int) -> None:
        await conn.rpush(key, n)
        in_use.append(len(pool._in_use_connections))

    try:
        await asyncio.gather(*(one(n) for n in range(200)))
        assert sorted(int(v) for v in await conn.lrange(key, 0, -1)) == list(range(200))
        assert max(in_use) <= 3
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 3
    finally:
        await conn.delete(key)
        await conn.aclose()


async def test_a_wait_gives_up_after_the_pools_timeout(redis_url: str) -> None:
    conn = client(redis_url, connections=1, timeout=0.2)
    key = f"pool-{uuid.uuid4()}"
    try:
        blocked: asyncio.Future[Any] = asyncio.ensure_future(conn.blpop([key], timeout=5))
        await asyncio.sleep(0.1)
        with pytest.raises(RedisConnectionError, match="No connection available"):
            await conn.ping()
        async with aioredis.Redis.from_url(redis_url) as other:
            await other.rpush(key, "go")
        assert tuple(await blocked) == (key.encode(), b"go")
        # Usable again once the connection is free.
        assert await conn.ping() is True
    finally:
        await conn.aclose()


async def test_a_waiter_that_goes_away_does_not_keep_the_next_waiting(redis_url: str) -> None:
    conn = client(redis_url, connections=1)
    key = f"pool-{uuid.uuid4()}"
    try:
        blocked: asyncio.Future[Any] = asyncio.ensure_future(conn.blpop([key], timeout=5))
        await asyncio.sleep(0.1)
        leaving: asyncio.Future[Any] = asyncio.ensure_future(conn.ping())
        staying: asyncio.Future[Any] = asyncio.ensure_future(conn.ping())
        await asyncio.sleep(0.05)
        leaving.cancel()
        async with aioredis.Redis.from_url(redis_url) as other:
            await other.rpush(key, "go")
        await blocked
        async with asyncio.timeout(5):
            assert await staying is True
        assert leaving.cancelled()
    finally:
        await conn.aclose()


def test_the_daemons_bounded_clients_use_it(redis_url: str) -> None:
    bounded = async_client(redis_url, max_connections=4, wait_s=None)
    assert isinstance(bounded.connection_pool, QuickBlockingPool)
