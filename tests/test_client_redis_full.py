"""The client library against a full Redis (a redis-server of its own, ``noeviction``, its maxmemory set below
what it uses): a request refused is said so and nothing is sent; a wait goes on until Redis has room again;
a service's reply waits in the service until it can be queued."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError
from typer.testing import CliRunner

from client import AsyncClient, Client, Request, Service, SiteRedisFull
from client.cli import app
from client.cli_common import EXIT_REDIS
from client.request import reply_envelope
from tests.support.servers import RedisProcess, wait_until
from tests.support.waiting import wait_for
from tests.test_service import deliver, request_envelope
from wire import keys
from wire.envelope import Envelope, decode_payload

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

REFUSED_REQUEST = (
    "the site's Redis is full (maxmemory reached): it refuses new requests until memory is freed or "
    "maxmemory is raised; nothing was sent"
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProcess]:
    process = RedisProcess().start()
    try:
        yield process
    finally:
        process.cleanup()


@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    """A connection to the private Redis, emptied and with room again after the test."""
    conn = redis.Redis.from_url(server.url)
    try:
        conn.flushall()
        yield conn
    finally:
        make_room(conn)
        conn.close()


def fill(conn: redis.Redis) -> None:
    """Make Redis full: a maxmemory below what it already uses, with noeviction."""
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", 1)


def make_room(conn: redis.Redis) -> None:
    conn.config_set("maxmemory", 0)


def test_a_request_refused_by_a_full_redis_is_said_so_and_nothing_is_sent(
    server: RedisProcess, admin: redis.Redis
) -> None:
    fill(admin)
    with Client(server.url) as client, pytest.raises(SiteRedisFull) as refused:
        client.send(2, "full.echo", b"x")
    assert str(refused.value) == REFUSED_REQUEST
    assert isinstance(refused.value.__cause__, OutOfMemoryError)
    with Client(server.url) as client, pytest.raises(SiteRedisFull, match=r"^the site's Redis is full"):
        client.call(2, "full.echo", b"x", timeout=5)
    assert admin.llen(keys.LOCAL) == 0

    make_room(admin)
    with Client(server.url) as client:
        client.send(2, "full.echo", b"x")
    assert admin.llen(keys.LOCAL) == 1


async def test_the_async_client_says_so_too(server: RedisProcess, admin: redis.Redis) -> None:
    fill(admin)
    async with AsyncClient(server.url) as client:
        with pytest.raises(SiteRedisFull) as refused:
            await client.send([2, 3], "full.echo", b"x")
    assert str(refused.value) == REFUSED_REQUEST
    assert admin.llen(keys.LOCAL) == 0


def test_msgbus_send_prints_one_line_and_exits_with_the_redis_status(
    server: RedisProcess, admin: redis.Redis
) -> None:
    fill(admin)
    result = CliRunner().invoke(
        app, ["send", "--dst", "2", "--cmd", "full.echo", "--data", "x", "--redis", server.url]
    )
    assert result.exit_code == EXIT_REDIS
    assert result.output == f"error: {REFUSED_REQUEST}\n"
    assert admin.llen(keys.LOCAL) == 0


def taken_by_the_daemon(conn: redis.Redis) -> Envelope:
    raw = conn.lpop(keys.LOCAL)
    assert isinstance(raw, bytes)
    return Envelope.decode(raw)


def reply_to(request: Envelope, data: bytes) -> Envelope:
    return reply_envelope(request, data).replace(uid="2.1")


def test_a_wait_goes_on_while_redis_is_full_and_takes_the_reply_once_it_has_room(
    server: RedisProcess, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with Client(server.url) as client:
        ret = client.send(2, "full.echo", b"x")
        request = taken_by_the_daemon(admin)
        admin.lpush(ret, reply_to(request, b"pong").encode())
        fill(admin)
        replies: list[bytes] = []
        waiting = threading.Thread(
            target=lambda: replies.extend(r.data for r in client.wait(ret, timeout=30))
        )
        waiting.start()
        try:
            wait_until(
                lambda: any("the site's Redis is full" in message for message in caplog.messages),
                what="the wait to meet the full Redis",
            )
            assert replies == []
            make_room(admin)
        finally:
            waiting.join(timeout=30)
    assert replies == [b"pong"]
    assert admin.exists(ret, keys.taken_replies(ret)) == 0


def test_a_wait_that_ends_while_redis_is_full_says_so_and_the_reply_stays_for_the_next(
    server: RedisProcess, admin: redis.Redis
) -> None:
    with Client(server.url) as client:
        ret = client.send(2, "full.echo", b"x")
        request = taken_by_the_daemon(admin)
        admin.lpush(ret, reply_to(request, b"pong").encode())
        fill(admin)
        with pytest.raises(SiteRedisFull) as refused:
            client.wait(ret, timeout=0.2)
        assert str(refused.value).endswith(f"; the replies that arrived stay on {ret} for a later wait")
        make_room(admin)
        (reply,) = client.wait(ret, timeout=5)
    assert reply.data == b"pong"


async def test_a_services_reply_refused_by_a_full_redis_is_queued_once_it_has_room(
    server: RedisProcess, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="client.service")
    service = Service(server.url, poll_interval=0.05)

    @service.handler("full.echo")
    def echo(request: Request) -> bytes:
        # Redis fills up while the handler works: its reply is refused.
        fill(admin)
        return request.data

    async with aioredis.Redis.from_url(server.url) as conn:
        await deliver(conn, request_envelope("full.echo", b"kept"))
        stopping = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(service.serve(stopping=stopping))
            await wait_for(
                lambda: any(
                    message.startswith(
                        "cannot queue replies (the site's Redis is full (maxmemory reached): it "
                        "refuses replies until memory is freed or maxmemory is raised)"
                    )
                    for message in caplog.messages
                ),
                what="the reply to be refused",
            )
            assert await conn.llen(keys.REPLY) == 0
            make_room(admin)
            await wait_for(lambda: admin.llen(keys.REPLY) == 1, what="the reply to be queued")
            stopping.set()
        (raw,) = await conn.lrange(keys.REPLY, 0, -1)
    assert decode_payload(Envelope.decode(raw).dat) == b"kept"
    assert admin.llen(keys.service_processing(keys.command_queue("full.echo"), "default")) == 0
