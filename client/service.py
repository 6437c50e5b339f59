"""A service: handlers for commands, served from ``msgbus.<cmd>``, replying on ``msgbus.system.reply``.

The daemon routes each reply back to the caller (locally or to a remote twin, or straight to the return
queue on the proxy flow). How requests are taken and replies queued, crash-safely, is
:mod:`client.service_run`: requests reach handlers at least once. Give each process serving the same
command its own ``name``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from redis.asyncio import Redis

from client.errors import HandlerError
from client.protocol import DEFAULT_REDIS_URL, POP_CHUNK_S, pop_chunk
from client.request import HandlerResult, Request, encode_result, reply_envelope
from client.service_run import ServiceRun
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError, decode_payload
from wire.redis_url import async_client
from wire.reliable_list import ReliableList

log = logging.getLogger(__name__)

Handler = Callable[[Request], HandlerResult | Awaitable[HandlerResult]]
HandlerT = TypeVar("HandlerT", bound=Handler)


class Service:
    """Serves commands to the bus with ``workers`` concurrent workers per command.

    Handlers take a :class:`~client.request.Request` and return the reply payload (bytes, str, None, or a
    value sent as JSON); they may be plain functions, run in a thread so they do not block the loop, or
    coroutine functions. An exception becomes the reply's ``err`` (``"<type>: <message>"``; just the
    message for :class:`~client.errors.HandlerError`). ``poll_interval`` bounds each blocking pop, hence
    how quickly :meth:`stop` takes effect; ``grace_s`` bounds how long handlers still running then may
    take (None: as long as they need); the requests of those cut short are served again at the next start.
    """

    def __init__(
        self,
        redis: str | Redis = DEFAULT_REDIS_URL,
        *,
        workers: int = 1,
        poll_interval: float = POP_CHUNK_S,
        name: str = "default",
        grace_s: float | None = None,
    ) -> None:
        if not isinstance(redis, str | Redis):
            raise TypeError(f"expected a Redis URL or a redis.asyncio.Redis, got {type(redis).__name__}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not 0 < poll_interval <= POP_CHUNK_S * 2:
            raise ValueError(
                f"poll_interval must be in (0, {POP_CHUNK_S * 2:g}] seconds, got {poll_interval}"
            )
        if not name:
            raise ValueError("the service name must not be empty")
        self._redis = redis
        self.name = name
        self.workers = workers
        self.poll_interval = poll_interval
        self.grace_s = grace_s
        self._handlers: dict[str, Handler] = {}
        self._stop_asked = threading.Event()
        self._stopped_by: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

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
        self._stop_asked.set()
        running = self._stopped_by
        if running is not None:
            loop, stopping = running
            loop.call_soon_threadsafe(stopping.set)

    def run(self, *, burst: bool = False) -> None:
        """Blocking :meth:`serve`; SIGINT/SIGTERM stop it gracefully (a second one stops it at once)."""
        asyncio.run(self._serve_with_signals(burst))

    async def serve(self, *, burst: bool = False, stopping: asyncio.Event | None = None) -> None:
        """Serve until :meth:`stop` (or until ``stopping`` is set), letting in-flight handlers finish (for at
        most ``grace_s``, if set).

        In ``burst`` mode, return instead as soon as the queues are empty.
        """
        if not self._handlers:
            raise RuntimeError("no handler registered")
        conn = async_client(self._redis) if isinstance(self._redis, str) else self._redis
        socket_timeout = conn.connection_pool.connection_kwargs.get("socket_timeout")
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="msgbus-handler")
        stopping = stopping or asyncio.Event()
        self._stopped_by = (asyncio.get_running_loop(), stopping)
        if self._stop_asked.is_set():
            stopping.set()
        lists = [
            ReliableList(conn, queue, keys.service_processing(queue, self.name), oldest="RIGHT")
            for queue in self._handlers
        ]
        run = ServiceRun(
            conn,
            lists,
            functools.partial(self.handle, executor=executor),
            stopping,
            workers=self.workers,
            poll_s=pop_chunk(socket_timeout, self.poll_interval),
            burst=burst,
            grace_s=self.grace_s,
        )
        log.info("serving %s with %d worker(s) each", ", ".join(self._handlers), self.workers)
        try:
            await run.run()
        finally:
            self._stopped_by = None
            executor.shutdown(wait=False)
            if conn is not self._redis:
                await conn.aclose()
            self._stop_asked.clear()

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
