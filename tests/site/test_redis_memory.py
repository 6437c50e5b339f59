"""The daemon's reading of its Redis's maxmemory-policy, against the suite's redis-server (its policy set back
to noeviction after each test), and against users that may not run INFO or CONFIG."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from msgbusd.reports.metrics import Metrics
from msgbusd.site.redis_memory import RedisMemory
from tests.support.metrics import samples
from tests.support.servers import free_port
from tests.support.waiting import wait_for

# What the daemon calls its Redis in what it says (redacted --redis).
URL = "redis://127.0.0.1:6379/0"
WARNING = (
    f"Redis at {URL} has maxmemory-policy allkeys-lru: under memory pressure it may drop queued messages; "
    "set maxmemory-policy noeviction (redis.conf or CONFIG SET)"
)


@pytest.fixture
def set_policy(sync_redis: redis.Redis) -> Iterator[Callable[[str], None]]:
    def set_to(policy: str) -> None:
        sync_redis.config_set("maxmemory-policy", policy)

    try:
        yield set_to
    finally:
        set_to("noeviction")


@pytest.fixture
def set_maxmemory(sync_redis: redis.Redis) -> Iterator[Callable[[int], None]]:
    def set_to(limit: int) -> None:
        sync_redis.config_set("maxmemory", limit)

    try:
        yield set_to
    finally:
        set_to(0)


@pytest.fixture
async def limited_user(
    sync_redis: redis.Redis, redis_url: str
) -> AsyncIterator[Callable[..., aioredis.Redis]]:
    """A connection as a user denied the given commands (ACL), deleted afterwards."""
    users: list[str] = []
    connections: list[aioredis.Redis] = []

    def connect(*denied: str) -> aioredis.Redis:
        user = f"limited-{uuid.uuid4().hex[:8]}"
        sync_redis.acl_setuser(
            user, enabled=True, nopass=True, keys=["*"], commands=["+@all", *(f"-{c}" for c in denied)]
        )
        users.append(user)
        conn = aioredis.Redis.from_url(redis_url, username=user, password="")
        connections.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in connections:
            await conn.aclose()
        for user in users:
            sync_redis.acl_deluser(user)


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "msgbusd.redis_memory" and r.levelno >= 30]


async def test_an_evicting_policy_is_named_in_a_warning_in_the_log_and_among_the_sites_warnings(
    async_redis: aioredis.Redis, set_policy: Callable[[str], None], caplog: pytest.LogCaptureFixture
) -> None:
    set_policy("allkeys-lru")
    memory = RedisMemory(async_redis, URL)

    await memory.check()

    assert memory.policy == "allkeys-lru"
    assert warnings_logged(caplog) == [WARNING]
    assert memory.warnings() == [WARNING]
    await memory.check()
    assert warnings_logged(caplog) == [WARNING], "said again only when it changes"


async def test_noeviction_is_no_warning(
    async_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    memory = RedisMemory(async_redis, URL)
    await memory.check()
    assert memory.policy == "noeviction"
    assert memory.warnings() == [] and warnings_logged(caplog) == []


def evicting_gauge(metrics: Metrics) -> float:
    return samples(metrics.render()[0].decode())["msgbus_redis_evicting"]


async def test_a_policy_changed_at_run_time_is_seen_at_the_next_read(
    async_redis: aioredis.Redis, set_policy: Callable[[str], None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="msgbusd.redis_memory")
    metrics = Metrics()
    memory = RedisMemory(async_redis, URL, metrics=metrics, refresh_s=0.01)
    await memory.check()
    assert evicting_gauge(metrics) == 0
    stopping = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(memory.watch(stopping))
        set_policy("volatile-lru")
        await wait_for(lambda: memory.policy == "volatile-lru", what="the new policy to be read")
        assert memory.warnings() == [WARNING.replace("allkeys-lru", "volatile-lru")]
        assert evicting_gauge(metrics) == 1
        set_policy("noeviction")
        await wait_for(lambda: memory.policy == "noeviction", what="noeviction to be read again")
        assert memory.warnings() == [] and evicting_gauge(metrics) == 0
        stopping.set()
    assert caplog.messages[-1] == f"Redis at {URL} has maxmemory-policy noeviction now: it evicts nothing"


async def test_where_info_is_not_allowed_config_get_tells_the_policy(
    limited_user: Callable[..., aioredis.Redis], set_policy: Callable[[str], None]
) -> None:
    set_policy("allkeys-random")
    memory = RedisMemory(limited_user("info"), URL)
    await memory.check()
    assert memory.policy == "allkeys-random"


async def test_a_redis_that_tells_the_policy_neither_way_is_said_once_and_warned_of_nowhere(
    limited_user: Callable[..., aioredis.Redis],
    set_policy: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    set_policy("allkeys-lru")
    memory = RedisMemory(limited_user("info", "config"), URL)
    await memory.check()
    await memory.check()
    assert memory.policy is None and memory.warnings() == []
    assert warnings_logged(caplog) == [
        f"cannot tell whether Redis at {URL} may evict queued messages: neither INFO memory nor CONFIG GET "
        "names its maxmemory-policy; make sure it is noeviction"
    ]


async def test_a_redis_that_is_away_leaves_the_last_view_as_it_was() -> None:
    away = aioredis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    try:
        memory = RedisMemory(away, URL)
        memory.policy = "allkeys-lru"
        await memory.check()
        assert memory.policy == "allkeys-lru"
    finally:
        await away.aclose()


async def test_a_redis_full_at_start_is_said_and_the_first_write_made_once_it_has_room(
    async_redis: aioredis.Redis, set_maxmemory: Callable[[int], None], caplog: pytest.LogCaptureFixture
) -> None:
    set_maxmemory(1)
    memory = RedisMemory(async_redis, URL)
    tries: list[None] = []

    async def first_write() -> None:
        tries.append(None)
        await async_redis.set("msgbus.test.first", "1")

    with caplog.at_level(logging.INFO, logger="msgbusd.redis_memory"):
        starting = asyncio.ensure_future(memory.start(first_write, asyncio.Event()))
        await wait_for(lambda: len(tries) >= 3, 10, "a few tries of the first write")
        assert not starting.done()
        set_maxmemory(0)
        assert await asyncio.wait_for(starting, 10) is True
    assert await async_redis.get("msgbus.test.first") == b"1"
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2, "said once while it waits (again only a minute later), and once it has room"
    assert re.fullmatch(
        rf"Redis at {re.escape(URL)} is full "
        r"\((OOM )?command not allowed when used memory > 'maxmemory'\.?\): it refuses writes until memory "
        r"is freed or maxmemory is raised \(CONFIG SET maxmemory\); msgbusd "
        r"starts once it has room",
        said[0],
    ), said[0]
    assert said[1] == f"Redis at {URL} has room again: msgbusd starts"


async def test_a_stop_while_waiting_for_room_ends_the_start(
    async_redis: aioredis.Redis, set_maxmemory: Callable[[int], None]
) -> None:
    set_maxmemory(1)
    stopping = asyncio.Event()
    starting = asyncio.ensure_future(
        RedisMemory(async_redis, URL).start(lambda: async_redis.set("msgbus.test.first", "1"), stopping)
    )
    stopping.set()
    assert await asyncio.wait_for(starting, 10) is False
