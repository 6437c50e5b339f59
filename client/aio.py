"""The asyncio client: push a request to the local daemon, take its replies (mirrors :mod:`client.sync`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from client.errors import SiteRedisFull, refused_when_full
from client.protocol import (
    DEFAULT_REDIS_URL,
    DEFAULT_RETRIES,
    ReplyCollector,
    ReplyTaker,
    build_request,
    call_timeout,
    destinations,
    pop_chunk,
    wait_timeout,
)
from client.replies import Reply
from wire import keys
from wire.redis_url import async_client


class AsyncClient:
    """An asyncio RMB client for the local site, over a Redis URL or an existing ``redis.asyncio.Redis``.

    A connection made from a URL is closed by :meth:`aclose` (or on leaving an ``async with`` block); one
    passed in is left to its owner. ``timeout`` parameters are seconds, like the sync client's (the caller may
    still wrap a call in ``asyncio.timeout``: a reply taken when it strikes stays in Redis for a later
    :meth:`wait`).

    Requests are RPUSHed and replies taken as by :class:`~client.sync.Client`: in order, and without losing
    any to a lost connection, a Redis restart or a client that dies.
    """

    def __init__(self, redis: str | Redis = DEFAULT_REDIS_URL) -> None:
        if isinstance(redis, str):
            self._redis: Redis = async_client(redis)
            self._owned = True
        elif isinstance(redis, Redis):
            self._redis = redis
            self._owned = False
        else:
            raise TypeError(f"expected a Redis URL or a redis.asyncio.Redis, got {type(redis).__name__}")

    @property
    def redis(self) -> Redis:
        """The underlying connection."""
        return self._redis

    async def aclose(self) -> None:
        """Close the connection if this client made it."""
        if self._owned:
            await self._redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def ping(self) -> None:
        """Check that Redis answers (raises ``redis.exceptions.ConnectionError`` otherwise)."""
        await self._redis.ping()

    async def send(
        self,
        dst: int | Sequence[int],
        cmd: str,
        data: bytes | str = b"",
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
    ) -> str:
        """Push a request for ``cmd`` to each twin in ``dst`` and return its return queue, without waiting.

        ``exp`` is the request's lifetime in seconds (0: the daemon's default, 3600); ``retries`` is how often
        the daemon retries a failed delivery. Raises :class:`~client.errors.SiteRedisFull` if the site's
        Redis is full.
        """
        request = build_request(dst, cmd, data, exp=exp, retries=retries)
        # RPUSH: the daemon pops from the left, so requests are served in the order they were sent.
        with refused_when_full("new requests", "nothing was sent"):
            await self._redis.rpush(keys.LOCAL, request.encode())
        return request.ret

    async def wait(
        self,
        ret: str,
        count: int = 1,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Reply]:
        """Take ``count`` replies from return queue ``ret``, in arrival order, starting with any that an
        earlier wait took but did not return.

        ``timeout`` defaults to the default request lifetime (``math.inf`` waits forever); raises
        :class:`~client.errors.CallTimeout` if fewer replies arrive in time, ``redis``'s ``ConnectionError``
        if Redis does not answer at first or stays away until then, and
        :class:`~client.errors.SiteRedisFull` if it is still full then (it has no room to hand replies over).
        """
        return await self._collect(ReplyCollector(ret, count=count), wait_timeout(timeout))

    async def call(
        self,
        dst: int | Sequence[int],
        cmd: str,
        data: bytes | str = b"",
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Reply]:
        """Send a request and return one :class:`Reply` per destination, in the order of ``dst``.

        ``timeout`` defaults to the request's lifetime plus a grace period. Replies carrying an error are
        returned, not raised; raises :class:`~client.errors.CallTimeout` if some twin does not answer in time
        and :class:`~client.errors.ProtocolError` if a reply cannot be decoded. A connection lost while
        waiting is retried until the timeout, and so is a full Redis; one full before the request is sent
        raises :class:`~client.errors.SiteRedisFull` (nothing was sent).
        """
        twins = destinations(dst)
        seconds = call_timeout(timeout, exp)
        ret = await self.send(twins, cmd, data, exp=exp, retries=retries)
        return await self._collect(ReplyCollector(ret, dst=twins), seconds, fresh=True)

    async def call_one(
        self,
        dst: int,
        cmd: str,
        data: bytes | str = b"",
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> bytes:
        """Call one twin and return its payload.

        Raises :class:`~client.errors.RemoteError` if the reply carries an error.
        """
        (reply,) = await self.call(dst, cmd, data, exp=exp, retries=retries, timeout=timeout)
        return reply.raise_for_error().data

    async def call_json(
        self,
        dst: int,
        cmd: str,
        payload: Any,
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        """Call one twin with ``payload`` as JSON and return its reply parsed from JSON."""
        (reply,) = await self.call(dst, cmd, json.dumps(payload), exp=exp, retries=retries, timeout=timeout)
        return reply.raise_for_error().json()

    async def _collect(
        self, collector: ReplyCollector, seconds: float, *, fresh: bool = False
    ) -> list[Reply]:
        socket_timeout = self._redis.connection_pool.connection_kwargs.get("socket_timeout")
        taker = ReplyTaker(collector, seconds, pop_chunk(socket_timeout), fresh=fresh)
        while not taker.finished:
            try:
                with taker.redis_full():
                    async with self._redis.pipeline(transaction=False) as pipe:
                        taker.queue(pipe)
                        results = await pipe.execute()
            except (RedisConnectionError, RedisTimeoutError, SiteRedisFull) as exc:
                delay = taker.retry_after(exc)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            taker.take(results)
        return taker.result()
