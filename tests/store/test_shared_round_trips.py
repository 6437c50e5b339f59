"""Script calls of many tasks sent to a real Redis together: each caller gets its own answers (or its own
error), a flushed script cache is recovered from, and a Redis that went away fails the callers waiting, not
the calls made once it is back."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from msgbusd.store import shared_round_trips
from msgbusd.store.shared_round_trips import SharedRoundTrips
from testing.local_sites import RedisProcess

# Appends ARGV[1] to KEYS[1] and returns the list's length; fails on purpose when ARGV[1] is 'fail'.
APPEND = """
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""


async def reads_of(redis: aioredis.Redis) -> int:
    """How many times Redis read from its clients: one per round trip of a pipeline this size."""
    return int((await redis.info("stats"))["total_reads_processed"])


async def test_calls_made_together_share_round_trips_and_each_caller_gets_its_own_answers(
    async_redis: aioredis.Redis,
) -> None:
    append = async_redis.register_script(APPEND)
    await async_redis.script_load(APPEND)
    shared = SharedRoundTrips(async_redis)

    async def caller(n: int) -> list[int]:
        return await shared.run([(append, [f"list:{n}"], ["a"]), (append, [f"list:{n}"], ["b"])])

    answers = await asyncio.gather(*(caller(n) for n in range(200)))
    assert answers == [[1, 2]] * 200
    assert [await async_redis.lrange(f"list:{n}", 0, -1) for n in (0, 199)] == [[b"a", b"b"]] * 2
    # The 400 calls of 200 callers made at once went in a few round trips, not 200.
    before = await reads_of(async_redis)
    await asyncio.gather(*(caller(n) for n in range(200)))
    round_trips = await reads_of(async_redis) - before - 1
    assert 1 <= round_trips <= 5


async def test_a_callers_failing_script_is_its_own_error(async_redis: aioredis.Redis) -> None:
    append = async_redis.register_script(APPEND)
    shared = SharedRoundTrips(async_redis)
    good_before = shared.run([(append, ["list:1"], ["x"])])
    failing = shared.run([(append, ["list:2"], ["y"]), (append, ["list:2"], ["fail"])])
    good_after = shared.run([(append, ["list:3"], ["z"])])
    results = await asyncio.gather(good_before, failing, good_after, return_exceptions=True)
    assert results[0] == [1] and results[2] == [1]
    assert isinstance(results[1], ResponseError) and "asked to fail" in str(results[1])
    # The failing caller's other call ran (as in one pipeline of its own): scripts are not transactions.
    assert await async_redis.lrange("list:2", 0, -1) == [b"y"]


async def test_scripts_flushed_from_redis_are_loaded_again(async_redis: aioredis.Redis) -> None:
    append = async_redis.register_script(APPEND)
    shared = SharedRoundTrips(async_redis)
    assert await shared.run([(append, ["list:1"], ["a"])]) == [1]
    await async_redis.script_flush()
    answers = await asyncio.gather(*(shared.run([(append, ["list:1"], [str(n)])]) for n in range(5)))
    assert sorted(answer for (answer,) in answers) == [2, 3, 4, 5, 6]


async def test_more_calls_than_one_round_trip_takes_go_in_several(
    async_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_round_trips, "MAX_CALLS", 3)
    append = async_redis.register_script(APPEND)
    shared = SharedRoundTrips(async_redis)
    answers = await asyncio.gather(
        shared.run([(append, ["list:1"], ["a"]), (append, ["list:1"], ["b"])]),
        shared.run([(append, ["list:1"], ["c"]), (append, ["list:1"], ["d"])]),
        # Larger than a round trip: it goes alone, whole.
        shared.run([(append, ["list:2"], [str(n)]) for n in range(5)]),
    )
    assert answers == [[1, 2], [3, 4], [1, 2, 3, 4, 5]]


async def test_callers_waiting_when_redis_goes_away_get_the_error_and_later_calls_work() -> None:
    server = RedisProcess().start()
    try:
        redis = aioredis.Redis.from_url(server.url, socket_timeout=5)
        append = redis.register_script(APPEND)
        shared = SharedRoundTrips(redis)
        assert await shared.run([(append, ["list:1"], ["a"])]) == [1]
        server.kill()
        failed = await asyncio.gather(
            *(shared.run([(append, ["list:1"], ["b"])]) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(error, (RedisConnectionError, OSError)) for error in failed), failed
        server.start()
        # A fresh server: the list is gone, the script not loaded; the shared round trips work again.
        assert await shared.run([(append, ["list:1"], ["c"])]) == [1]
        await redis.aclose()
    finally:
        server.cleanup()
