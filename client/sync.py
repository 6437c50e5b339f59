"""The blocking client: push a request to the local daemon and take its replies."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from redis import Redis
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
from wire.redis_url import sync_client


class Client:
    """A blocking RMB client for the local site, over a Redis URL or an existing ``redis.Redis``.

    A connection made from a URL is closed by :meth:`close` (or on leaving a ``with`` block); one passed in is
    left to its owner.

    Requests are RPUSHed, so the daemon serves them in the order they were sent. Replies are moved into the
    return queue's taken list before they are read, and removed from it only once returned (or carried by the
    error raised), so a reply survives a lost connection, a Redis restart (with persistence) and a client that
    dies: a later :meth:`wait` on the same return queue gets it. A connection lost while waiting is retried
    until the wait's deadline; see :class:`~client.protocol.ReplyTaker`.
    """

    def __init__(self, redis: str | Redis = DEFAULT_REDIS_URL) -> None:
        if isinstance(redis, str):
            self._redis: Redis = sync_client(redis)
            self._owned = True
        elif isinstance(redis, Redis):
            self._redis = redis
            self._owned = False
        else:
            raise TypeError(f"expected a Redis URL or a redis.Redis, got {type(redis).__name__}")

    @property
    def redis(self) -> Redis:
        """The underlying connection."""
        return self._redis

    def close(self) -> None:
        """Close the connection if this client made it."""
        if self._owned:
            self._redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def ping(self) -> None:
        """Check that Redis answers (raises ``redis.exceptions.ConnectionError`` otherwise)."""
        self._redis.ping()

    def send(
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
            self._redis.rpush(keys.LOCAL, request.encode())
        return request.ret

    def wait(self, ret: str, count: int = 1, *, timeout: float | None = None) -> list[Reply]:
        """Take ``count`` replies from return queue ``ret``, in arrival order, starting with any that an
        earlier wait took but did not return.

        ``timeout`` defaults to the default request lifetime (``math.inf`` waits forever); raises
        :class:`~client.errors.CallTimeout` if fewer replies arrive in time, ``redis``'s ``ConnectionError``
        if Redis does not answer at first or stays away until then, and
        :class:`~client.errors.SiteRedisFull` if it is still full then (it has no room to hand replies over).
        """
        return self._collect(ReplyCollector(ret, count=count), wait_timeout(timeout))

    def call(
        self,
        dst: int | Sequence[int],
        cmd: str,
        data: bytes | str = b"",
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,
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
        ret = self.send(twins, cmd, data, exp=exp, retries=retries)
        return self._collect(ReplyCollector(ret, dst=twins), seconds, fresh=True)

    def call_one(
        self,
        dst: int,
        cmd: str,
        data: bytes | str = b"",
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,
    ) -> bytes:
        """Call one twin and return its payload.

        Raises :class:`~client.errors.RemoteError` if the reply carries an error.
        """
        (reply,) = self.call(dst, cmd, data, exp=exp, retries=retries, timeout=timeout)
        return reply.raise_for_error().data

    def call_json(
        self,
        dst: int,
        cmd: str,
        payload: Any,
        *,
        exp: int = 0,
        retries: int = DEFAULT_RETRIES,
        timeout: float | None = None,
    ) -> Any:
        """Call one twin with ``payload`` as JSON and return its reply parsed from JSON."""
        (reply,) = self.call(dst, cmd, json.dumps(payload), exp=exp, retries=retries, timeout=timeout)
        return reply.raise_for_error().json()

    def _collect(self, collector: ReplyCollector, seconds: float, *, fresh: bool = False) -> list[Reply]:
        socket_timeout = self._redis.connection_pool.connection_kwargs.get("socket_timeout")
        taker = ReplyTaker(collector, seconds, pop_chunk(socket_timeout), fresh=fresh)
        while not taker.finished:
            try:
                with taker.redis_full(), self._redis.pipeline(transaction=False) as pipe:
                    taker.queue(pipe)
                    results = pipe.execute()
            except (RedisConnectionError, RedisTimeoutError, SiteRedisFull) as exc:
                delay = taker.retry_after(exc)
                if delay is None:
                    raise
                time.sleep(delay)
                continue
            taker.take(results)
        return taker.result()
