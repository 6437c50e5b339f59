from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from testing.local_sites import RedisProcess


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One redis-server for the whole run; each test gets it flushed (see ``redis_url``)."""
    server = RedisProcess().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    return redis_server.url


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
async def async_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        await conn.aclose()
