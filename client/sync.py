"""The blocking client: push a request to the local daemon and pop its replies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any, cast

from redis import Redis

from client.protocol import (
    DEFAULT_REDIS_URL,
    DEFAULT_RETRIES,
    Deadline,
    ReplyCollector,
    build_request,
    call_timeout,
    destinations,
    pop_chunk,
    wait_timeout,
)
from client.replies import Reply
from msgbusd import keys


class Client:
    """A blocking RMB client for the local site, over a Redis URL or an existing ``redis.Redis``.

    A connection made from a URL is closed by :meth:`close` (or on leaving a ``with`` block); one passed in is
    left to its owner.
    """

    def __init__(self, redis: str | Redis = DEFAULT_REDIS_URL) -> None:
        if isinstance(redis, str):
            self._redis: Redis = Redis.from_url(redis)
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
        the daemon retries a failed delivery.
        """
        request = build_request(dst, cmd, data, exp=exp, retries=retries)
        self._redis.lpush(keys.LOCAL, request.encode())
        return request.ret

    def wait(self, ret: str, count: int = 1, *, timeout: float | None = None) -> list[Reply]:
        """Pop ``count`` replies from return queue ``ret``, in arrival order.

        ``timeout`` defaults to the default request lifetime (``math.inf`` waits forever); raises
        :class:`~client.errors.CallTimeout` if fewer replies arrive in time.
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
        and :class:`~client.errors.ProtocolError` if a reply cannot be decoded.
        """
        twins = destinations(dst)
        seconds = call_timeout(timeout, exp)
        ret = self.send(twins, cmd, data, exp=exp, retries=retries)
        return self._collect(ReplyCollector(ret, dst=twins), seconds)

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

    def _collect(self, collector: ReplyCollector, seconds: float) -> list[Reply]:
        deadline = Deadline(
            seconds, pop_chunk(self._redis.connection_pool.connection_kwargs.get("socket_timeout"))
        )
        while not collector.done:
            chunk = deadline.next_chunk()
            if chunk is None:
                # Past the deadline: take only what is already there.
                raw = self._redis.rpop(collector.ret)
                if raw is None:
                    raise collector.timeout(seconds)
                collector.add(cast(bytes | str, raw))
                continue
            # The daemon LPUSHes replies: popping from the right takes them in arrival order.
            popped = self._redis.brpop([collector.ret], timeout=chunk)
            if popped is not None:
                collector.add(popped[1])
        return collector.replies()
