"""The client library (callers and services) and the msgbus command reach a Redis through real
redis-sentinel processes, and follow it across a failover."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from redis.exceptions import RedisError
from typer.testing import CliRunner

from client import Service
from client.aio import AsyncClient
from client.cli import app
from client.sync import Client
from testing.local_sentinel import SentinelGroup
from testing.local_sites import wait_until
from wire import keys
from wire.envelope import Envelope, encode_payload
from wire.redis_url import sync_client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    started = SentinelGroup().start()
    try:
        yield started
    finally:
        started.cleanup()


def test_a_client_follows_the_master_across_a_failover(group: SentinelGroup) -> None:
    with Client(group.url) as client:
        client.send(7, "sentinel.echo", b"before")
        old_master = group.master_port()
        (group.master if group.master.port == old_master else group.replica).kill()  # type: ignore[union-attr]
        wait_until(lambda: group.master_port() != old_master, 60, "the sentinels to promote the replica")
        rets: list[str] = []

        def sent() -> bool:
            # Until every sentinel has taken the new master in, one may still say there is none.
            try:
                rets.append(client.send(7, "sentinel.echo", b"after"))
            except RedisError:
                return False
            return True

        wait_until(sent, 30, "a send to the new master")
        (second,) = rets
    with sync_client(group.url) as conn:
        queued = [Envelope.decode(raw).ret for raw in conn.lrange(keys.LOCAL, 0, -1)]
    assert second in queued


def test_the_asyncio_client_pushes_to_the_master(group: SentinelGroup) -> None:
    async def push() -> str:
        async with AsyncClient(group.url) as client:
            return await client.send(7, "sentinel.echo", b"async")

    ret = asyncio.run(push())
    with sync_client(group.url) as conn:
        assert ret in [Envelope.decode(raw).ret for raw in conn.lrange(keys.LOCAL, 0, -1)]


def test_msgbus_status_reads_redis_through_the_sentinels(group: SentinelGroup) -> None:
    with sync_client(group.url) as conn:
        waiting = conn.llen(keys.LOCAL)
    result = CliRunner().invoke(app, ["status", "--redis", group.url, "--json", "--timeout", "5"])
    # No daemon runs here: the status says so, and shows what it read from Redis.
    redis_part = json.loads(result.stdout)["redis"]
    assert redis_part["reachable"] and redis_part["error"] is None
    assert redis_part["queues"][0] == {"name": keys.LOCAL, "waiting": waiting, "processing": 0}


def test_a_service_serves_requests_through_the_sentinels(group: SentinelGroup) -> None:
    service = Service(group.url)
    service.register("sentinel.upper", lambda request: request.data.upper())
    request = Envelope(
        uid="7.1", cmd="sentinel.upper", exp=60, dat=encode_payload(b"hello"), src=9, dst=(7,), ret=keys.REPLY
    )
    with sync_client(group.url) as conn:
        conn.delete(keys.REPLY)
        conn.lpush(keys.command_queue("sentinel.upper"), request.encode())
        asyncio.run(service.serve(burst=True))
        (raw,) = conn.lrange(keys.REPLY, 0, -1)
    reply = Envelope.decode(raw)
    assert (reply.uid, reply.src, reply.dst, reply.payload) == ("7.1", 7, (9,), b"HELLO")
