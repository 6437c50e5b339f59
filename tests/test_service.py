"""Service against a real Redis; the tests play the daemon on msgbus.<cmd> and msgbus.system.reply."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from client import HandlerError, Request, Service
from client.request import encode_result, reply_envelope
from wire import keys
from wire.envelope import Envelope, decode_payload, encode_payload

SERVICE_TWIN = 5
CALLER_TWIN = 9


def request_envelope(cmd: str, data: bytes = b"", n: int = 1, **changes: Any) -> Envelope:
    """A request as the daemon delivers it to msgbus.<cmd>."""
    envelope = Envelope(
        uid=f"{SERVICE_TWIN}.{n}",
        cmd=cmd,
        exp=60,
        retries=1,
        dat=encode_payload(data),
        src=CALLER_TWIN,
        dst=(SERVICE_TWIN,),
        ret=keys.REPLY,
        now=int(time.time()) - 5,
        sig="73" + "00" * 64,
    )
    return envelope.replace(**changes)


async def deliver(conn: aioredis.Redis, *requests: Envelope, queue: str | None = None) -> None:
    """LPUSH requests to msgbus.<cmd> (or to ``queue``), as the daemon does."""
    for request in requests:
        await conn.lpush(queue or keys.command_queue(request.cmd), request.encode())


async def replies(conn: aioredis.Redis) -> list[Envelope]:
    """Every reply pushed so far, oldest first."""
    raw = await conn.lrange(keys.REPLY, 0, -1)
    return [Envelope.decode(item) for item in reversed(raw)]


async def next_reply(conn: aioredis.Redis) -> Envelope:
    popped = await conn.brpop([keys.REPLY], timeout=10)
    assert popped is not None, "no reply reached msgbus.system.reply"
    return Envelope.decode(popped[1])


async def test_sync_handler_reply_swaps_src_and_dst(redis_url: str, async_redis: aioredis.Redis) -> None:
    service = Service(redis_url)
    seen: list[tuple[bytes, int, str, str]] = []

    @service.handler("echo")
    def echo(request: Request) -> bytes:
        seen.append((request.data, request.src, request.cmd, threading.current_thread().name))
        return request.data.upper()

    request = request_envelope("echo", b"hello", pxy=True, shm="schema")
    await deliver(async_redis, request)
    await service.serve(burst=True)

    (reply,) = await replies(async_redis)
    assert reply.src == SERVICE_TWIN and reply.dst == (CALLER_TWIN,)
    assert reply.payload == b"HELLO"
    assert (reply.uid, reply.cmd, reply.pxy, reply.ret, reply.exp) == ("5.1", "echo", True, keys.REPLY, 60)
    assert (reply.err, reply.sig, reply.shm) == ("", "", "schema")
    assert reply.now >= request.now
    assert seen[0][:3] == (b"hello", CALLER_TWIN, "echo")
    assert seen[0][3].startswith("msgbus-handler")  # ran in a worker thread, not on the loop


async def test_async_handler_and_result_encodings(redis_url: str, async_redis: aioredis.Redis) -> None:
    service = Service(redis_url)

    @service.handler("json")
    async def as_json(request: Request) -> dict[str, Any]:
        return {"got": request.json()}

    service.register("text", lambda request: request.text() + " ✓")
    service.register("none", lambda request: None)
    assert service.commands == ["json", "text", "none"]

    await deliver(
        async_redis,
        request_envelope("json", b'{"a": 1}', n=1),
        request_envelope("text", b"ok", n=2),
        request_envelope("none", b"x", n=3),
    )
    await service.serve(burst=True)

    by_uid = {reply.uid: reply for reply in await replies(async_redis)}
    assert decode_payload(by_uid["5.1"].dat) == b'{"got": {"a": 1}}'
    assert decode_payload(by_uid["5.2"].dat) == "ok ✓".encode()
    assert decode_payload(by_uid["5.3"].dat) == b""
    assert all(reply.err == "" for reply in by_uid.values())


async def test_handler_exceptions_become_the_reply_error(redis_url: str, async_redis: aioredis.Redis) -> None:
    service = Service(redis_url)

    @service.handler("fail")
    def fail(request: Request) -> bytes:
        if request.data == b"plain":
            raise HandlerError("exactly this text")
        raise ValueError("bad input")

    @service.handler("afail")
    async def afail(request: Request) -> bytes:
        raise KeyError("missing")

    service.register("unserialisable", lambda request: {"a": object()})
    await deliver(
        async_redis,
        request_envelope("fail", b"x", n=1),
        request_envelope("fail", b"plain", n=2),
        request_envelope("afail", n=3),
        request_envelope("unserialisable", n=4),
    )
    await service.serve(burst=True)

    errors = {reply.uid: reply.err for reply in await replies(async_redis)}
    assert errors["5.1"] == "ValueError: bad input"
    assert errors["5.2"] == "exactly this text"
    assert errors["5.3"] == "KeyError: 'missing'"
    assert errors["5.4"].startswith("TypeError: ")


async def test_bad_items_are_skipped_and_the_worker_goes_on(
    redis_url: str, async_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(redis_url)
    service.register("echo", lambda request: request.data)
    queue = keys.command_queue("echo")
    await async_redis.lpush(queue, b"not json", b'{"src": "nine"}')
    await deliver(
        async_redis,
        request_envelope("echo", n=1, dat="%%%"),
        request_envelope("unknown", n=2),
        request_envelope("echo", b"fine", n=3),
        queue=queue,
    )
    await service.serve(burst=True)

    by_uid = {reply.uid: reply for reply in await replies(async_redis)}
    assert set(by_uid) == {"5.1", "5.2", "5.3"}
    assert by_uid["5.1"].err.startswith("invalid request: dat is not base64")
    assert by_uid["5.2"].err == "no handler for command 'unknown'"
    assert (by_uid["5.3"].err, decode_payload(by_uid["5.3"].dat)) == ("", b"fine")
    assert sum("skipping an undecodable request" in record.message for record in caplog.records) == 2
    assert await async_redis.llen(keys.command_queue("echo")) == 0


async def test_one_worker_serves_requests_first_in_first_out(
    redis_url: str, async_redis: aioredis.Redis
) -> None:
    order: list[bytes] = []
    service = Service(redis_url)
    service.register("echo", lambda request: order.append(request.data))
    await deliver(async_redis, *(request_envelope("echo", bytes([65 + i]), n=i) for i in range(5)))
    await service.serve(burst=True)
    assert order == [b"A", b"B", b"C", b"D", b"E"]


async def test_async_workers_run_concurrently(redis_url: str, async_redis: aioredis.Redis) -> None:
    workers = 3
    barrier = asyncio.Barrier(workers)
    service = Service(redis_url, workers=workers)

    @service.handler("meet")
    async def meet(request: Request) -> bytes:
        # Passes only if all the workers are inside a handler at the same time.
        async with asyncio.timeout(10):
            await barrier.wait()
        return b"met"

    await deliver(async_redis, *(request_envelope("meet", n=i) for i in range(workers)))
    await service.serve(burst=True)
    assert [reply.err for reply in await replies(async_redis)] == [""] * workers


async def test_sync_handlers_run_in_parallel_threads(redis_url: str, async_redis: aioredis.Redis) -> None:
    workers = 3
    barrier = threading.Barrier(workers, timeout=10)
    service = Service(redis_url, workers=workers)

    @service.handler("meet")
    def meet(request: Request) -> bytes:
        barrier.wait()  # raises BrokenBarrierError unless all the workers are inside a handler at once
        return b"met"

    await deliver(async_redis, *(request_envelope("meet", n=i) for i in range(workers)))
    await service.serve(burst=True)
    assert [reply.err for reply in await replies(async_redis)] == [""] * workers


async def test_stop_lets_the_in_flight_handler_finish(redis_url: str, async_redis: aioredis.Redis) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    service = Service(async_redis, workers=2, poll_interval=0.1)

    @service.handler("slow")
    async def slow(request: Request) -> bytes:
        started.set()
        await release.wait()
        return b"done"

    task = asyncio.create_task(service.serve())
    await deliver(async_redis, request_envelope("slow"))
    async with asyncio.timeout(10):
        await started.wait()
    service.stop()
    release.set()
    async with asyncio.timeout(10):
        await task

    reply = await next_reply(async_redis)
    assert (reply.uid, decode_payload(reply.dat)) == ("5.1", b"done")
    assert await async_redis.ping()  # a connection passed in stays open


def test_run_blocks_until_stopped_from_another_thread(redis_url: str, sync_redis: redis.Redis) -> None:
    service = Service(redis_url, poll_interval=0.1)
    service.register("echo", lambda request: request.data)
    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        sync_redis.lpush(keys.command_queue("echo"), request_envelope("echo", b"ping").encode())
        popped = sync_redis.brpop([keys.REPLY], timeout=10)
        assert popped is not None
        assert decode_payload(Envelope.decode(popped[1]).dat) == b"ping"
    finally:
        service.stop()
        runner.join(timeout=10)
    assert not runner.is_alive()


def test_configuration_errors() -> None:
    service = Service()
    with pytest.raises(ValueError):
        service.register("", lambda request: None)
    with pytest.raises(RuntimeError, match="no handler"):
        asyncio.run(service.serve())
    with pytest.raises(ValueError):
        Service(workers=0)
    with pytest.raises(ValueError):
        Service(poll_interval=10)
    with pytest.raises(TypeError):
        Service(42)  # type: ignore[arg-type]


def test_reply_building_and_result_encoding() -> None:
    request = request_envelope("cmd", b"q", dst=())
    reply = reply_envelope(request, b"a", err="")
    assert (reply.src, reply.dst) == (0, (CALLER_TWIN,))  # proxy-flow requests may carry no dst
    assert encode_result(bytearray(b"x")) == b"x"
    assert encode_result([1, "a"]) == b'[1, "a"]'
    assert encode_result(True) == b"true"


async def test_requests_left_by_a_killed_service_are_served_first_at_the_next_start(
    async_redis: aioredis.Redis, redis_url: str
) -> None:
    queue = keys.command_queue("crash.me")
    processing = keys.service_processing(queue, "worker-a")
    # What a service killed mid-request leaves: its request in its processing list, newer ones queued.
    await async_redis.lpush(processing, request_envelope("crash.me", b"first", n=1).encode())
    await async_redis.lpush(queue, request_envelope("crash.me", b"second", n=2).encode())
    service = Service(redis_url, name="worker-a")
    service.register("crash.me", lambda request: request.data.upper())
    await service.serve(burst=True)
    replies = [Envelope.decode(r) for r in reversed(await async_redis.lrange(keys.REPLY, 0, -1))]
    assert [r.payload for r in replies] == [b"FIRST", b"SECOND"]
    assert await async_redis.llen(processing) == 0


async def test_a_service_only_takes_back_its_own_unfinished_requests(
    async_redis: aioredis.Redis, redis_url: str
) -> None:
    queue = keys.command_queue("shared")
    other = keys.service_processing(queue, "worker-b")
    await async_redis.lpush(other, request_envelope("shared", b"busy elsewhere").encode())
    service = Service(redis_url, name="worker-a")
    service.register("shared", lambda request: b"")
    await service.serve(burst=True)
    assert await async_redis.llen(other) == 1
    assert await async_redis.llen(keys.REPLY) == 0


async def test_a_handler_still_running_after_the_grace_time_is_served_again_at_the_next_start(
    async_redis: aioredis.Redis,
) -> None:
    started = asyncio.Event()
    calls: list[bytes] = []
    service = Service(async_redis, poll_interval=0.1, grace_s=0.1)

    @service.handler("stuck")
    async def stuck(request: Request) -> bytes:
        calls.append(request.data)
        if len(calls) == 1:
            started.set()
            await asyncio.Event().wait()  # never returns: cancelled after the grace time
        return b"served"

    stopping = asyncio.Event()
    task = asyncio.create_task(service.serve(stopping=stopping))
    await deliver(async_redis, request_envelope("stuck", b"once more"))
    async with asyncio.timeout(10):
        await started.wait()
    stopping.set()
    async with asyncio.timeout(10):
        await task
    assert await async_redis.llen(keys.REPLY) == 0
    assert await async_redis.llen(keys.service_processing(keys.command_queue("stuck"), "default")) == 1

    await service.serve(burst=True)
    assert calls == [b"once more", b"once more"]
    assert decode_payload((await next_reply(async_redis)).dat) == b"served"


async def test_a_burst_of_requests_is_answered_in_full_by_a_few_workers(
    async_redis: aioredis.Redis, redis_url: str
) -> None:
    service = Service(redis_url, workers=4)
    service.register("double", lambda request: request.data * 2)
    await deliver(async_redis, *(request_envelope("double", b"%d" % i, n=i) for i in range(300)))
    await service.serve(burst=True)
    answers = {reply.uid: decode_payload(reply.dat) for reply in await replies(async_redis)}
    assert answers == {f"{SERVICE_TWIN}.{i}": b"%d" % i * 2 for i in range(300)}
    assert await async_redis.llen(keys.service_processing(keys.command_queue("double"), "default")) == 0
