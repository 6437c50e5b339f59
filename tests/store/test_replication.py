"""--redis-wait-replicas: writes wait for the replicas the master has, against real redis-servers."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from msgbusd.store.replication import Replication, ReplicationError
from msgbusd.store.script_batch import ScriptBatch
from testing.local_sites import RedisProcess, wait_until


async def pushed(client: aioredis.Redis, replication: Replication, value: str) -> None:
    batch = ScriptBatch(client, replication)
    batch.command("rpush", "replicated.list", value)
    await batch.run()


@pytest.fixture
async def master_and_replica() -> AsyncIterator[tuple[RedisProcess, RedisProcess]]:
    master = RedisProcess().start()
    replica = RedisProcess(replica_of=master.port).start()
    try:
        wait_until(replica.in_sync, 20, "the replica to be in sync")
        yield master, replica
    finally:
        replica.cleanup()
        master.cleanup()


async def test_a_write_is_done_once_the_replica_has_it(
    master_and_replica: tuple[RedisProcess, RedisProcess],
) -> None:
    master, replica = master_and_replica
    client = aioredis.Redis.from_url(master.url)
    try:
        await pushed(client, Replication(1), "a")
        # The wait returned: the replica has it already, not eventually.
        async with aioredis.Redis.from_url(replica.url) as on_replica:
            assert await on_replica.lrange("replicated.list", 0, -1) == [b"a"]
        assert replica.process is not None
        # Stopped, the replica stays online for the master but acknowledges nothing: the wait falls short,
        # and says so.
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(ReplicationError, match="only 0 of 1 replica"):
                await pushed(client, Replication(1, wait_ms=200), "b")
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        # Gone, it is no longer waited for: it cannot be promoted.
        replica.kill()
        wait_until(lambda: online_replicas(master.port) == 0, 20, "the master to see its replica gone")
        await pushed(client, Replication(1, wait_ms=200), "c")
    finally:
        await client.aclose()


async def test_a_master_without_a_replica_is_not_waited_for(async_redis: aioredis.Redis) -> None:
    replication = Replication(1, wait_ms=200)
    await pushed(async_redis, replication, "a")
    await pushed(async_redis, replication, "b")
    assert await async_redis.lrange("replicated.list", 0, -1) == [b"a", b"b"]


def online_replicas(port: int) -> int:
    with redis.Redis(port=port) as conn:
        return len(conn.execute_command("ROLE")[2])


async def test_a_replica_that_comes_online_is_waited_for_from_the_next_write() -> None:
    master = RedisProcess().start()
    client = aioredis.Redis.from_url(master.url)
    replica = RedisProcess(replica_of=master.port)
    try:
        replication = Replication(1, wait_ms=200)
        await pushed(client, replication, "a")
        replica.start()
        wait_until(lambda: online_replicas(master.port) == 1, 20, "the replica to be online")
        assert replica.process is not None
        # Stopped, the replica stays online for the master but acknowledges nothing.
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            # The first write since it came online was not waited for: it fails, to be made again.
            with pytest.raises(ReplicationError, match=r"1 replica\(s\) online, 0 waited for"):
                await pushed(client, replication, "b")
            with pytest.raises(ReplicationError, match="only 0 of 1 replica"):
                await pushed(client, replication, "b")
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        # Going on, it acknowledges again (given the time to catch up).
        await pushed(client, Replication(1), "c")
        async with aioredis.Redis.from_url(replica.url) as on_replica:
            assert (await on_replica.lrange("replicated.list", 0, -1))[-1] == b"c"
    finally:
        await client.aclose()
        replica.cleanup()
        master.cleanup()


async def test_without_replicas_asked_for_nothing_is_added(async_redis: aioredis.Redis) -> None:
    await pushed(async_redis, Replication(0), "a")
    assert await async_redis.exists("msgbus.system.replicated") == 0
