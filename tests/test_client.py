"""Client and AsyncClient against a real Redis; the tests play the daemon on msgbus.system.local."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio as aioredis

from client import AsyncClient, CallTimeout, Client, ProtocolError, RemoteError, Reply
from client.protocol import (
    DEFAULT_EXP_S,
    EXPIRY_GRACE_S,
    POP_CHUNK_S,
    Deadline,
    call_timeout,
    pop_chunk,
    wait_timeout,
)
from wire import keys
from wire.envelope import Envelope, encode_payload
from wire.error_texts import all_retries_done_text, expired_text, invalid_message_text

LOCAL_TWIN = 1


def take_request(conn: redis.Redis) -> Envelope:
    """Pop the next request from msgbus.system.local, as the daemon does."""
    popped = conn.blpop([keys.LOCAL], timeout=10)
    assert popped is not None, "no request reached msgbus.system.local"
    return Envelope.decode(popped[1])


async def take_request_async(conn: aioredis.Redis) -> Envelope:
    popped = await conn.blpop([keys.LOCAL], timeout=10)
    assert popped is not None, "no request reached msgbus.system.local"
    return Envelope.decode(popped[1])


def answer(request: Envelope, twin: int, data: bytes = b"", err: str = "", n: int = 1) -> bytes:
    """The reply the daemon puts on the client's return queue for ``twin``."""
    reply = request.replace(
        uid=f"{twin}.{n}", src=twin, dst=[LOCAL_TWIN], dat=encode_payload(data), err=err, now=int(time.time())
    )
    return reply.encode()


# --- sync client ---------------------------------------------------------------------------------------


def test_call_pushes_a_wire_request_and_returns_the_reply(redis_url: str, sync_redis: redis.Redis) -> None:
    before = int(time.time())
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, 5, "zos.echo", b"\x00hello", exp=30, retries=4, timeout=10)
        raw = sync_redis.blpop([keys.LOCAL], timeout=10)
        assert raw is not None
        wire = json.loads(raw[1])
        request = Envelope.decode(raw[1])
        sync_redis.lpush(request.ret, answer(request, 5, b"world"))
        (reply,) = future.result(timeout=10)

    assert list(wire) == ["ver", "uid", "cmd", "exp", "try", "dat", "src", "dst", "ret", "shm", "now", "pxy",
                          "err", "sig"]  # fmt: skip
    assert wire["try"] == 4
    assert (request.ver, request.uid, request.src, request.dst, request.cmd) == (1, "", 0, (5,), "zos.echo")
    assert request.exp == 30
    assert base64.b64decode(request.dat) == b"\x00hello"
    assert uuid.UUID(request.ret).version == 4
    assert before <= request.now <= int(time.time())
    assert (reply.src, reply.data, reply.error, reply.uid, reply.ok) == (5, b"world", "", "5.1", True)
    assert reply.envelope.ret == request.ret


def test_each_call_gets_a_fresh_return_queue(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client:
        first, second = client.send(5, "a"), client.send(5, "a")
    assert first != second
    assert sync_redis.llen(keys.LOCAL) == 2


def test_call_returns_replies_in_destination_order(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 7, 9], "cmd", "hi", timeout=10)
        request = take_request(sync_redis)
        assert request.dst == (5, 7, 9)
        for twin, data, err in [(9, b"nine", ""), (5, b"", "boom"), (7, b"seven", "")]:
            sync_redis.lpush(request.ret, answer(request, twin, data, err))
        replies = future.result(timeout=10)

    assert [(r.src, r.data, r.error) for r in replies] == [
        (5, b"", "boom"),
        (7, b"seven", ""),
        (9, b"nine", ""),
    ]
    assert [r.ok for r in replies] == [False, True, True]
    with pytest.raises(RemoteError) as info:
        replies[0].raise_for_error()
    assert (info.value.error, info.value.src, info.value.reply) == ("boom", 5, replies[0])
    assert replies[1].raise_for_error() is replies[1]


def test_duplicate_destinations_get_one_reply_each(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 5], "cmd", timeout=10)
        request = take_request(sync_redis)
        sync_redis.lpush(request.ret, answer(request, 5, b"a", n=1), answer(request, 5, b"b", n=2))
        replies = future.result(timeout=10)
    assert [(r.src, r.data) for r in replies] == [(5, b"a"), (5, b"b")]


def test_daemon_errors_are_matched_to_their_destination(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 7], "cmd", timeout=10)
        request = take_request(sync_redis)
        # The local daemon's own messages: an expiry naming twin 7 in the uid, a retry failure without a twin.
        expired = request.replace(uid="7.3", src=LOCAL_TWIN, err=expired_text(3600))
        failed = request.replace(src=LOCAL_TWIN, err=all_retries_done_text("connection refused"))
        sync_redis.lpush(request.ret, expired.encode(), failed.encode())
        replies = future.result(timeout=10)
    assert [(r.src, r.error) for r in replies] == [
        (5, "all retries done: connection refused"),
        (7, "request timeout (expiration reached, 3600)"),
    ]


def test_an_invalid_message_error_answers_every_destination(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 7], "cmd", timeout=10)
        request = take_request(sync_redis)
        rejected = request.replace(err=invalid_message_text("protocol version mismatch"))
        sync_redis.lpush(request.ret, rejected.encode())
        replies = future.result(timeout=10)
    assert [(r.src, r.error) for r in replies] == [
        (5, "received invalid message: protocol version mismatch"),
        (7, "received invalid message: protocol version mismatch"),
    ]


def test_timeout_names_missing_twins_and_keeps_arrived_replies(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call, [5, 7, 9], "cmd", timeout=0.5)
        request = take_request(sync_redis)
        sync_redis.lpush(request.ret, answer(request, 7, b"seven"))
        with pytest.raises(CallTimeout) as info:
            future.result(timeout=10)

    error = info.value
    assert error.missing == (5, 9)
    assert [(r.src, r.data) for r in error.replies] == [(7, b"seven")]
    assert (error.ret, error.expected, error.timeout) == (request.ret, 3, 0.5)
    assert "no reply from twins 5, 9" in str(error)


def test_send_then_wait_returns_replies_in_arrival_order(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client:
        ret = client.send([5, 7], "cmd", b"x", exp=10)
        request = take_request(sync_redis)
        assert request.ret == ret
        sync_redis.lpush(ret, answer(request, 7, b"seven"))
        sync_redis.lpush(ret, answer(request, 5, b"five"))
        replies = client.wait(ret, 2, timeout=10)
    assert [(r.src, r.data) for r in replies] == [(7, b"seven"), (5, b"five")]


def test_wait_with_zero_timeout_takes_what_is_already_there(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client:
        ret = client.send(5, "cmd")
        request = take_request(sync_redis)
        sync_redis.lpush(ret, answer(request, 5, b"ready"))
        (reply,) = client.wait(ret, timeout=0)
        assert reply.data == b"ready"
        with pytest.raises(CallTimeout) as info:
            client.wait(ret, timeout=0)
    assert (info.value.missing, info.value.replies, info.value.expected) == ((), [], 1)
    assert "0 of 1 replies arrived" in str(info.value)


def test_undecodable_reply_raises_protocol_error(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client:
        ret = client.send(5, "cmd")
        sync_redis.lpush(ret, b"not json")
        with pytest.raises(ProtocolError) as info:
            client.wait(ret, timeout=5)
        assert info.value.raw == b"not json"

        sync_redis.lpush(ret, json.dumps({"src": "5", "dat": ""}))
        with pytest.raises(ProtocolError, match="field 'src'"):
            client.wait(ret, timeout=5)

        request = take_request(sync_redis)
        sync_redis.lpush(ret, request.replace(src=5, dat="%%%").encode())
        with pytest.raises(ProtocolError, match="not base64"):
            client.wait(ret, timeout=5)


def test_call_one_and_call_json(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client, ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.call_json, 5, "math.add", {"a": 1, "b": 2}, timeout=10)
        request = take_request(sync_redis)
        assert json.loads(base64.b64decode(request.dat)) == {"a": 1, "b": 2}
        sync_redis.lpush(request.ret, answer(request, 5, b'{"sum": 3}'))
        assert future.result(timeout=10) == {"sum": 3}

        future_one = pool.submit(client.call_one, 5, "cmd", b"x", timeout=10)
        request = take_request(sync_redis)
        sync_redis.lpush(request.ret, answer(request, 5, b"raw"))
        assert future_one.result(timeout=10) == b"raw"

        failing = pool.submit(client.call_json, 5, "math.add", [], timeout=10)
        request = take_request(sync_redis)
        sync_redis.lpush(request.ret, answer(request, 5, err="ValueError: bad input"))
        with pytest.raises(RemoteError) as info:
            failing.result(timeout=10)
    assert (info.value.error, info.value.src) == ("ValueError: bad input", 5)
    assert str(info.value) == "twin 5: ValueError: bad input"


def test_reply_json_and_dict_forms() -> None:
    envelope = Envelope(uid="5.1", src=5, dat=encode_payload(b"\xff\xfe"))
    binary = Reply.from_envelope(envelope)
    with pytest.raises(ProtocolError, match="not JSON"):
        binary.json()
    assert binary.to_dict() == {"src": 5, "uid": "5.1", "data": "//4=", "base64": True, "error": ""}
    text = Reply.from_envelope(envelope.replace(dat=encode_payload('{"ok": "é"}'.encode())))
    assert text.json() == {"ok": "é"}
    assert text.to_dict()["data"] == '{"ok": "é"}'
    assert text.to_dict()["base64"] is False


def test_bad_arguments_are_rejected_before_anything_is_sent(redis_url: str, sync_redis: redis.Redis) -> None:
    with Client(redis_url) as client:
        with pytest.raises(ValueError, match="command"):
            client.send(5, "")
        with pytest.raises(ValueError, match="destination"):
            client.send([], "cmd")
        with pytest.raises(ValueError, match="positive"):
            client.send([5, 0], "cmd")
        with pytest.raises(TypeError):
            client.send(["5"], "cmd")  # type: ignore[list-item]
        with pytest.raises(ValueError, match="exp"):
            client.send(5, "cmd", exp=-1)
        with pytest.raises(ValueError, match="timeout"):
            client.call(5, "cmd", timeout=-1)
        with pytest.raises(ValueError, match="count"):
            client.wait("ret", 0)
    assert sync_redis.llen(keys.LOCAL) == 0


def test_a_given_connection_is_left_open(sync_redis: redis.Redis) -> None:
    with Client(sync_redis) as client:
        client.ping()
        assert client.redis is sync_redis
    assert sync_redis.ping()
    with pytest.raises(TypeError):
        Client(42)  # type: ignore[arg-type]


def test_default_timeouts_follow_the_request_lifetime() -> None:
    assert call_timeout(None, 0) == DEFAULT_EXP_S + EXPIRY_GRACE_S
    assert call_timeout(None, 30) == 30 + EXPIRY_GRACE_S
    assert call_timeout(2.5, 30) == 2.5
    assert wait_timeout(None) == DEFAULT_EXP_S + EXPIRY_GRACE_S
    assert wait_timeout(math.inf) == math.inf


def test_long_waits_are_cut_into_short_blocking_pops() -> None:
    # redis-py's default 5 s socket timeout would abort a longer BRPOP.
    chunk = Deadline(3600).next_chunk()
    assert chunk is not None
    assert 0 < chunk <= POP_CHUNK_S < 5
    assert Deadline(math.inf).next_chunk() == POP_CHUNK_S
    assert Deadline(0).next_chunk() is None
    assert pop_chunk(None) == pop_chunk(5) == POP_CHUNK_S
    assert pop_chunk(0.4) == 0.2


def test_waits_outlast_a_short_socket_timeout(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, socket_timeout=0.3) as conn, Client(conn) as client:
        ret = str(uuid.uuid4())
        with pytest.raises(CallTimeout):
            client.wait(ret, timeout=0.8)


def test_the_client_package_does_not_import_the_daemon_web_stack() -> None:
    code = (
        "import sys, client, client.cli\n"
        "heavy = {'starlette', 'uvicorn', 'httpx', 'nacl', 'substrateinterface', 'msgbusd.identity.keys'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


# --- async client --------------------------------------------------------------------------------------


async def test_async_call_returns_replies_in_destination_order(
    redis_url: str, async_redis: aioredis.Redis
) -> None:
    async with AsyncClient(redis_url) as client:
        task = asyncio.create_task(client.call([7, 5], "cmd", b"q", exp=20, timeout=10))
        request = await take_request_async(async_redis)
        assert (request.dst, request.exp, request.retries) == ((7, 5), 20, 2)
        await async_redis.lpush(request.ret, answer(request, 5, b"five"))
        await async_redis.lpush(request.ret, answer(request, 7, err="nope"))
        replies = await task
    assert [(r.src, r.data, r.error) for r in replies] == [(7, b"", "nope"), (5, b"five", "")]


async def test_async_timeout_carries_partial_replies(redis_url: str, async_redis: aioredis.Redis) -> None:
    async with AsyncClient(async_redis) as client:
        task = asyncio.create_task(client.call([5, 7], "cmd", timeout=0.5))
        request = await take_request_async(async_redis)
        await async_redis.lpush(request.ret, answer(request, 5, b"five"))
        with pytest.raises(CallTimeout) as info:
            await task
    assert info.value.missing == (7,)
    assert [r.src for r in info.value.replies] == [5]
    assert await async_redis.ping()


async def test_async_send_wait_and_json(redis_url: str, async_redis: aioredis.Redis) -> None:
    async with AsyncClient(redis_url) as client:
        ret = await client.send(5, "cmd", "text")
        request = await take_request_async(async_redis)
        assert base64.b64decode(request.dat) == b"text"
        await async_redis.lpush(ret, answer(request, 5, b"[1, 2]"))
        (reply,) = await client.wait(ret, timeout=10)
        assert reply.json() == [1, 2]

        task = asyncio.create_task(client.call_json(5, "cmd", {"q": 1}, timeout=10))
        request = await take_request_async(async_redis)
        await async_redis.lpush(request.ret, answer(request, 5, err="denied"))
        with pytest.raises(RemoteError, match="twin 5: denied"):
            await task

        task_one = asyncio.create_task(client.call_one(5, "cmd", timeout=10))
        request = await take_request_async(async_redis)
        await async_redis.lpush(request.ret, answer(request, 5, b"one"))
        assert await task_one == b"one"
