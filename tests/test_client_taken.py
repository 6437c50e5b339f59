"""Replies are moved to a taken list before the client reads them: none is lost if Redis or the client goes.

The tests play the daemon by pushing replies onto the return queue; those that restart Redis start their own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from client import AsyncClient, CallTimeout, Client, ProtocolError
from client.protocol import ReplyCollector, ReplyTaker
from tests.support.servers import RedisProcess, free_port, wait_until
from tests.support.tcp_proxy import TcpProxy
from wire import keys
from wire.envelope import Envelope, encode_payload

pytestmark = pytest.mark.timeout(60)


def reply(ret: str, twin: int, data: bytes) -> bytes:
    """A reply from ``twin`` as the daemon puts it on return queue ``ret``."""
    return Envelope(uid=f"{twin}.1", src=twin, dst=(1,), ret=ret, dat=encode_payload(data)).encode()


def leave_taken(conn: redis.Redis, ret: str, *replies: bytes) -> None:
    """Put ``replies`` (oldest first) in the taken list, as a client that moved them and died leaves them."""
    for raw in replies:
        conn.lpush(keys.taken_replies(ret), raw)


def redis_port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def blocked_clients(conn: redis.Redis) -> int:
    return int(conn.info("clients")["blocked_clients"])


@pytest.fixture
def aof_redis() -> Iterator[RedisProcess]:
    """A redis-server of its own with an append-only file, for the tests that restart it."""
    server = RedisProcess(appendonly=True).start()
    try:
        yield server
    finally:
        server.cleanup()


def restart(server: RedisProcess) -> None:
    """Stop and start ``server``; return once it has loaded its append-only file."""
    server.stop()
    server.start()
    with redis.Redis.from_url(server.url) as conn:
        wait_until(lambda: conn.info("persistence")["loading"] == 0, what="Redis to load its data")


# --- what a dead client left behind --------------------------------------------------------------------


def test_wait_returns_replies_left_taken_before_newer_ones(redis_url: str, sync_redis: redis.Redis) -> None:
    ret = str(uuid.uuid4())
    leave_taken(sync_redis, ret, reply(ret, 5, b"first"), reply(ret, 6, b"second"))
    sync_redis.lpush(ret, reply(ret, 7, b"third"))
    with Client(redis_url) as client:
        replies = client.wait(ret, 3, timeout=5)
    assert [r.data for r in replies] == [b"first", b"second", b"third"]
    assert not sync_redis.exists(keys.taken_replies(ret), ret)


def test_a_wait_takes_only_its_count_and_leaves_the_rest_taken(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    ret = str(uuid.uuid4())
    leave_taken(sync_redis, ret, reply(ret, 5, b"first"), reply(ret, 6, b"second"))
    with Client(redis_url) as client:
        (first,) = client.wait(ret, timeout=5)
        assert sync_redis.lrange(keys.taken_replies(ret), 0, -1) == [reply(ret, 6, b"second")]
        (second,) = client.wait(ret, timeout=0)
    assert (first.data, second.data) == (b"first", b"second")
    assert not sync_redis.exists(keys.taken_replies(ret))


async def test_async_wait_returns_replies_left_taken(redis_url: str, async_redis: aioredis.Redis) -> None:
    ret = str(uuid.uuid4())
    await async_redis.lpush(keys.taken_replies(ret), reply(ret, 5, b"left"))
    await async_redis.lpush(ret, reply(ret, 6, b"new"))
    async with AsyncClient(redis_url) as client:
        replies = await client.wait(ret, 2, timeout=5)
    assert [r.data for r in replies] == [b"left", b"new"]
    assert not await async_redis.exists(keys.taken_replies(ret), ret)


def test_a_reply_that_shows_up_taken_during_a_wait_goes_first(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    # What a move redis-py repeated on its own after a broken connection leaves behind.
    ret = str(uuid.uuid4())
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.wait, ret, 2, timeout=10)
        wait_until(lambda: blocked_clients(sync_redis) == 1, what="the client to block")
        leave_taken(sync_redis, ret, reply(ret, 5, b"older"))
        sync_redis.lpush(ret, reply(ret, 6, b"newer"))
        replies = future.result(timeout=15)
    assert [r.data for r in replies] == [b"older", b"newer"]
    assert not sync_redis.exists(keys.taken_replies(ret))


# --- the taken list itself -----------------------------------------------------------------------------


def test_the_taken_list_holds_arrived_replies_with_a_ttl_until_the_call_returns(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 7], "cmd", timeout=10)
        popped = sync_redis.blpop([keys.LOCAL], timeout=10)
        assert popped is not None
        request = Envelope.decode(popped[1])
        taken = keys.taken_replies(request.ret)
        sync_redis.lpush(request.ret, reply(request.ret, 5, b"five"))
        wait_until(lambda: sync_redis.llen(taken) == 1, what="the first reply to be taken")
        assert 0 < sync_redis.ttl(taken) <= keys.RETURN_QUEUE_TTL_S
        sync_redis.lpush(request.ret, reply(request.ret, 7, b"seven"))
        replies = future.result(timeout=15)
    assert [(r.src, r.data) for r in replies] == [(5, b"five"), (7, b"seven")]
    assert not sync_redis.exists(taken, request.ret)


async def test_async_call_leaves_no_taken_list(redis_url: str, async_redis: aioredis.Redis) -> None:
    async with AsyncClient(redis_url) as client:
        task = asyncio.create_task(client.call(5, "cmd", timeout=10))
        popped = await async_redis.blpop([keys.LOCAL], timeout=10)
        assert popped is not None
        ret = Envelope.decode(popped[1]).ret
        await async_redis.lpush(ret, reply(ret, 5, b"five"))
        (answer,) = await task
    assert answer.data == b"five"
    assert not await async_redis.exists(keys.taken_replies(ret), ret)


def test_a_timeout_hands_over_the_replies_it_carries(redis_url: str, sync_redis: redis.Redis) -> None:
    ret = str(uuid.uuid4())
    sync_redis.lpush(ret, reply(ret, 5, b"five"))
    with Client(redis_url) as client, pytest.raises(CallTimeout) as info:
        client.wait(ret, 2, timeout=0.2)
    assert [r.data for r in info.value.replies] == [b"five"]
    assert not sync_redis.exists(keys.taken_replies(ret))


def test_an_undecodable_reply_is_dropped_and_the_good_ones_stay_taken(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    ret = str(uuid.uuid4())
    sync_redis.lpush(ret, reply(ret, 5, b"five"), b"not json")
    with Client(redis_url) as client:
        with pytest.raises(ProtocolError) as info:
            client.wait(ret, 2, timeout=5)
        assert info.value.raw == b"not json"
        assert sync_redis.lrange(keys.taken_replies(ret), 0, -1) == [reply(ret, 5, b"five")]
        (again,) = client.wait(ret, timeout=0)
    assert again.data == b"five"


def test_each_reply_costs_one_round_trip() -> None:
    # The normal case, without I/O: a move per reply, then one round to clear the taken list.
    ret = str(uuid.uuid4())
    taker = ReplyTaker(ReplyCollector(ret, count=2), 10, 1, fresh=True)
    rounds = []
    for answers in ([reply(ret, 5, b"a"), True, 1], [reply(ret, 6, b"b"), True, 2], [1, 1]):
        pipe = redis.Redis().pipeline(transaction=False)
        taker.queue(pipe)
        rounds.append([command[0][0] for command in pipe.command_stack])
        taker.take(answers)
    assert taker.finished
    assert rounds == [["BLMOVE", "EXPIRE", "LLEN"], ["BLMOVE", "EXPIRE", "LLEN"], ["LREM", "LREM"]]
    assert [r.data for r in taker.result()] == [b"a", b"b"]


# --- Redis going away ----------------------------------------------------------------------------------


def test_a_reply_whose_move_was_never_answered_is_not_lost(redis_url: str, sync_redis: redis.Redis) -> None:
    proxy = TcpProxy(("127.0.0.1", redis_port(redis_url)))
    ret = str(uuid.uuid4())
    try:
        with Client(f"redis://127.0.0.1:{proxy.port}/0") as client, ThreadPoolExecutor(1) as pool:
            future = pool.submit(client.wait, ret, timeout=20)
            wait_until(lambda: blocked_clients(sync_redis) == 1, what="the client to block")
            # Redis moves the reply, the connection breaks before the client reads the answer.
            proxy.drop_answers = 1.0
            sync_redis.lpush(ret, reply(ret, 5, b"moved"))
            wait_until(lambda: proxy.dropped_answers >= 1, what="the answer to be dropped")
            proxy.drop_answers = 0.0
            (answer,) = future.result(timeout=25)
    finally:
        proxy.close()
    assert answer.data == b"moved"
    assert not sync_redis.exists(keys.taken_replies(ret), ret)


def test_a_wait_carries_on_across_a_redis_restart(aof_redis: RedisProcess) -> None:
    ret = str(uuid.uuid4())
    with Client(aof_redis.url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.wait, ret, 2, timeout=30)
        with redis.Redis.from_url(aof_redis.url) as conn:
            wait_until(lambda: blocked_clients(conn) == 1, what="the client to block")
            # Moved just before Redis went away, its answer lost with the connection.
            leave_taken(conn, ret, reply(ret, 5, b"before"))
        restart(aof_redis)
        with redis.Redis.from_url(aof_redis.url) as conn:
            conn.lpush(ret, reply(ret, 6, b"after"))
            replies = future.result(timeout=35)
            assert [r.data for r in replies] == [b"before", b"after"]
            assert not conn.exists(keys.taken_replies(ret), ret)


async def test_an_async_wait_carries_on_across_a_redis_restart(aof_redis: RedisProcess) -> None:
    ret = str(uuid.uuid4())
    async with AsyncClient(aof_redis.url) as client:
        task = asyncio.create_task(client.wait(ret, 2, timeout=30))
        with redis.Redis.from_url(aof_redis.url) as conn:
            # The test's own calls block the loop: wait for the client's BLMOVE in a thread.
            await asyncio.to_thread(
                wait_until, lambda: blocked_clients(conn) == 1, 10.0, "the client to block"
            )
            leave_taken(conn, ret, reply(ret, 5, b"before"))
        await asyncio.to_thread(restart, aof_redis)
        async with aioredis.Redis.from_url(aof_redis.url) as conn_async:
            await conn_async.lpush(ret, reply(ret, 6, b"after"))
            replies = await asyncio.wait_for(task, 35)
            assert [r.data for r in replies] == [b"before", b"after"]
            assert not await conn_async.exists(keys.taken_replies(ret), ret)


def test_a_wait_gives_up_at_its_deadline_if_redis_stays_away(aof_redis: RedisProcess) -> None:
    ret = str(uuid.uuid4())
    # Without redis-py's own retries, so that only the client's count.
    conn = redis.Redis.from_url(aof_redis.url, retry=Retry(NoBackoff(), 0))
    with Client(conn) as client, ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        future = pool.submit(client.wait, ret, timeout=1.5)
        wait_until(lambda: blocked_clients(conn) == 1, what="the client to block")
        aof_redis.kill()
        with pytest.raises(redis.ConnectionError):
            future.result(timeout=15)
        elapsed = time.monotonic() - started
    conn.close()
    assert 1.5 <= elapsed < 10


def test_a_wait_on_a_redis_that_never_answered_fails_at_once() -> None:
    conn = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    with Client(conn) as client, pytest.raises(redis.ConnectionError):
        client.wait(str(uuid.uuid4()), timeout=30)
