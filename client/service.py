"""A service: workers that pop requests from ``msgbus.<cmd>``, run a handler and push the reply.

Replies go to ``msgbus.system.reply``, from where the daemon routes them back to the caller (locally or to a
remote twin, or straight to the return queue on the proxy flow).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from client.errors import HandlerError
from client.protocol import DEFAULT_REDIS_URL, POP_CHUNK_S, pop_chunk
from client.request import HandlerResult, Request, encode_result, reply_envelope
from msgbusd import keys
from msgbusd.envelope import Envelope, EnvelopeDecodeError, decode_payload

log = logging.getLogger(__name__)

Handler = Callable[[Request], HandlerResult | Awaitable[HandlerResult]]
HandlerT = TypeVar("HandlerT", bound=Handler)

# How often pushing a reply is tried before it is given up (Redis unreachable).
REPLY_PUSH_ATTEMPTS = 3


class Service:
    """Serves commands to the bus with ``workers`` concurrent workers.

    Handlers take a :class:`~client.request.Request` and return the reply payload (bytes, str, None, or a
    value sent as JSON); they may be plain functions, run in a thread so they do not block the loop, or
    coroutine functions. An exception becomes the reply's ``err`` (``"<type>: <message>"``; just the
    message for :class:`~client.errors.HandlerError`). ``poll_interval`` bounds each blocking pop, hence
    how quickly :meth:`stop` takes effect.
    """

    def __init__(
        self, redis: str | Redis = DEFAULT_REDIS_URL, *, workers: int = 1, poll_interval: float = POP_CHUNK_S
    ) -> None:
        if not isinstance(redis, str | Redis):
            raise TypeError(f"expected a Redis URL or a redis.asyncio.Redis, got {type(redis).__name__}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not 0 < poll_interval <= POP_CHUNK_S * 2:
            raise ValueError(
                f"poll_interval must be in (0, {POP_CHUNK_S * 2:g}] seconds, got {poll_interval}"
            )
        self._redis = redis
        self.workers = workers
        self.poll_interval = poll_interval
        self._handlers: dict[str, Handler] = {}
        self._stopping = threading.Event()

    @property
    def commands(self) -> list[str]:
        """The commands served, in registration order."""
        return [queue.removeprefix(keys.command_queue("")) for queue in self._handlers]

    def register(self, cmd: str, fn: Handler) -> None:
        """Serve ``cmd`` with ``fn`` (replacing any handler registered for it before)."""
        if not cmd:
            raise ValueError("the command must not be empty")
        self._handlers[keys.command_queue(cmd)] = fn

    def handler(self, cmd: str) -> Callable[[HandlerT], HandlerT]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: HandlerT) -> HandlerT:
            self.register(cmd, fn)
            return fn

        return decorate

    def stop(self) -> None:
        """Ask the workers to stop after their current request (safe from any thread or a signal handler)."""
        self._stopping.set()

    def run(self, *, burst: bool = False) -> None:
        """Blocking :meth:`serve`; SIGINT/SIGTERM stop it gracefully (a second one stops it at once)."""
        asyncio.run(self._serve_with_signals(burst))

    async def serve(self, *, burst: bool = False) -> None:
        """Serve until :meth:`stop`, letting in-flight handlers finish.

        In ``burst`` mode, return instead as soon as the queues are empty.
        """
        if not self._handlers:
            raise RuntimeError("no handler registered")
        conn = Redis.from_url(self._redis) if isinstance(self._redis, str) else self._redis
        socket_timeout = conn.connection_pool.connection_kwargs.get("socket_timeout")
        poll = pop_chunk(socket_timeout, self.poll_interval)
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="msgbus-handler")
        log.info("serving %s with %d worker(s)", ", ".join(self._handlers), self.workers)
        try:
            await asyncio.gather(*(self._worker(conn, executor, poll, burst) for _ in range(self.workers)))
        finally:
            executor.shutdown(wait=False)
            if conn is not self._redis:
                await conn.aclose()
            self._stopping.clear()

    async def handle(self, raw: bytes | str, executor: ThreadPoolExecutor | None = None) -> Envelope | None:
        """Run the handler for one raw request and return the reply, or None if the item is not an envelope.

        Sync handlers run in ``executor`` (the loop's default one when None).
        """
        try:
            request = Envelope.decode(raw)
        except EnvelopeDecodeError as exc:
            log.warning("skipping an undecodable request: %s: %r", exc.reason, exc.raw[:200])
            return None
        fn = self._handlers.get(keys.command_queue(request.cmd))
        if fn is None:
            return reply_envelope(request, err=f"no handler for command {request.cmd!r}")
        try:
            data = decode_payload(request.dat)
        except ValueError as exc:
            return reply_envelope(request, err=f"invalid request: {exc}")
        try:
            result = await _call(fn, Request(data, request), executor)
            return reply_envelope(request, encode_result(result))
        except HandlerError as exc:
            return reply_envelope(request, err=str(exc) or type(exc).__name__)
        except Exception as exc:
            log.exception(
                "handler for %r failed on request %r from twin %d", request.cmd, request.uid, request.src
            )
            return reply_envelope(request, err=f"{type(exc).__name__}: {exc}")

    async def _worker(self, conn: Redis, executor: ThreadPoolExecutor, poll: float, burst: bool) -> None:
        queues = list(self._handlers)
        while not self._stopping.is_set():
            raw = await self._next_request(conn, queues, poll, burst)
            if raw is None:
                if burst:
                    return
                continue
            try:
                reply = await self.handle(raw, executor)
                if reply is not None:
                    await self._push_reply(conn, reply)
            except Exception:
                log.exception("unexpected failure while serving a request; the worker goes on")

    async def _next_request(
        self, conn: Redis, queues: list[str], poll: float, burst: bool
    ) -> bytes | str | None:
        try:
            if burst:
                for queue in queues:
                    item = await conn.rpop(queue)
                    if item is not None:
                        return cast(bytes | str, item)
                return None
            # BRPOP: the daemon LPUSHes, so popping from the right serves requests first in, first out.
            popped = await conn.brpop(queues, timeout=poll)
        except RedisError as exc:
            if burst:
                raise
            log.warning("cannot pop requests from Redis: %s; retrying", exc)
            await asyncio.sleep(poll)
            return None
        return None if popped is None else popped[1]

    async def _push_reply(self, conn: Redis, reply: Envelope) -> None:
        for attempt in range(1, REPLY_PUSH_ATTEMPTS + 1):
            try:
                await conn.lpush(keys.REPLY, reply.encode())
                return
            except RedisError as exc:
                log.warning("cannot push the reply %r (attempt %d): %s", reply.uid, attempt, exc)
                if attempt < REPLY_PUSH_ATTEMPTS:
                    await asyncio.sleep(self.poll_interval)
        log.error("dropped the reply %r to twin %s: Redis unavailable", reply.uid, list(reply.dst))

    async def _serve_with_signals(self, burst: bool) -> None:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, loop, sig)
                installed.append(sig)
        try:
            await self.serve(burst=burst)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self, loop: asyncio.AbstractEventLoop, sig: signal.Signals) -> None:
        log.info("%s: finishing in-flight requests", sig.name)
        self.stop()
        # Back to the default action, so a second signal stops at once.
        loop.remove_signal_handler(sig)


async def _call(fn: Handler, request: Request, executor: ThreadPoolExecutor | None) -> HandlerResult:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):  # noqa: B004
        result = fn(request)
    else:
        result = await asyncio.get_running_loop().run_in_executor(executor, fn, request)
    if inspect.isawaitable(result):
        return await result
    return result
