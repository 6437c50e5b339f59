"""Redis URLs: redis-py's own, and redis+sentinel:// for a Redis that fails over."""

from __future__ import annotations

import pytest
import redis
import redis.utils
from redis.asyncio.connection import AbstractConnection

from wire.redis_url import (
    RedisUrlError,
    SentinelUrl,
    async_client,
    parse_sentinel_url,
    redacted,
    sync_client,
)

# Every kind of argument a command is given: text (also beyond ASCII), bytes of every value, numbers.
ARGUMENTS = (
    "key:é",
    bytes(range(256)),
    b"",
    7,
    -(2**63),
    2**70,
    1.5,
    0.1,
    bytearray(b"ab"),
    memoryview(b"cd"),
)


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    assert parse_sentinel_url("redis+sentinel://:s3cret@10.0.0.1:26379,[::1]:26380/main/2") == SentinelUrl(
        (("10.0.0.1", 26379), ("::1", 26380)), "main", 2, "s3cret"
    )
    assert parse_sentinel_url("redis+sentinel://h:26379/main") == SentinelUrl((("h", 26379),), "main")
    assert parse_sentinel_url("redis://localhost:6379/0") is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "name the master"),
        ("redis+sentinel://h:26379/", "name the master"),
        ("redis+sentinel://h/main", "HOST:PORT"),
        ("redis+sentinel://h:26379,:1/main", "HOST:PORT"),
        ("redis+sentinel://h:26379/main/zero", "database"),
    ],
)
def test_a_wrong_sentinel_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError, match=says):
        parse_sentinel_url(url)


def test_the_password_is_never_shown() -> None:
    assert redacted("redis+sentinel://:s3cret@h:1,h:2/main") == "redis+sentinel://:***@h:1,h:2/main"
    assert redacted("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"


async def test_an_async_client_packs_commands_in_c_with_the_same_bytes_and_meaning(redis_url: str) -> None:
    client = async_client(redis_url)
    try:
        connection = client.connection_pool.make_connection()
        python_packed = AbstractConnection.pack_command(connection, "SET", *ARGUMENTS)
        assert b"".join(connection.pack_command("SET", *ARGUMENTS)) == b"".join(map(bytes, python_packed))
        script = client.register_script("return {KEYS[1], ARGV[1], ARGV[2]}")
        await script(keys=["k"], args=[0])  # loaded
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("text:é", "välue")
            pipe.set(b"raw", bytes(range(256)))
            pipe.get("text:é")
            pipe.get(b"raw")
            pipe.evalsha(script.sha, 1, "k:é", 1.5, b"\x00\xff")
            answers = await pipe.execute()
        assert answers[2:] == ["välue".encode(), bytes(range(256)), ["k:é".encode(), b"1.5", b"\x00\xff"]]
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/none.sock", "redis+sentinel://h:1/m"],
)
async def test_every_kind_of_async_client_packs_in_c(url: str) -> None:
    client = async_client(url, max_connections=4)
    try:
        connection_class = client.connection_pool.connection_class
        packed = connection_class.pack_command(object.__new__(connection_class), "GET", "k")
        assert packed == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]
        assert connection_class.pack_command is not AbstractConnection.pack_command
    finally:
        await client.aclose()


async def test_a_new_connection_tells_redis_the_client_without_looking_its_version_up(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py 8 would read its version from the installed packages' metadata for every new connection.
    pytest.importorskip("redis.driver_info", reason="an older redis-py reads its version once, when imported")

    def looked_up() -> str:
        raise AssertionError("the version was looked up for a new connection")

    monkeypatch.setattr(redis.utils, "get_lib_version", looked_up)
    client = async_client(redis_url, max_connections=4)
    sync = sync_client(redis_url)
    try:
        assert await client.ping() and sync.ping()
        # What CLIENT SETINFO says (on Redis 7.2 and later) is what redis-py would have looked up.
        for pool in (client.connection_pool, sync.connection_pool):
            driver = pool.connection_kwargs["driver_info"]
            assert (driver.formatted_name, driver.lib_version) == ("redis-py", redis.__version__)
    finally:
        await client.aclose()
        sync.close()
