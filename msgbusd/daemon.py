"""The site daemon: one consumer per system queue, the retry and expiry timers, and the HTTP door.

Shutdown: the first SIGTERM/SIGINT stops popping and closing the door, gives in-flight items
``drain_grace_s`` to finish, and leaves the rest in the processing lists for the next start; a second
signal stops at once. Nothing is lost either way: unfinished items are still in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.routing import Route

from msgbusd import keys
from msgbusd.backoff import REDIS_RECONNECT, Backoff, sleep_unless
from msgbusd.companions import Companion, SiteHandle
from msgbusd.envelope import envelope_size_limit
from msgbusd.errors import StartupError
from msgbusd.event_log import EventLog
from msgbusd.handlers import Handlers
from msgbusd.http_api import Door, answer_link_frame, create_app, loopback_only
from msgbusd.http_client import HttpClients
from msgbusd.links import Links
from msgbusd.logs import about
from msgbusd.metrics import Metrics, healthz_endpoint, metrics_endpoint
from msgbusd.peers import Peers
from msgbusd.posts import PostClient
from msgbusd.queues import Store
from msgbusd.rate_limit import TokenBuckets
from msgbusd.schedule import CLAIM_BATCH, Schedule
from msgbusd.send_items import SendItem, SendItems
from msgbusd.serving import QuietServer, server
from msgbusd.settings import Settings
from msgbusd.signing import Signer
from twin_resolver.base import Resolver
from twin_resolver.cache import CachedResolver

log = logging.getLogger("msgbusd")

# A probe of a peer that does not answer waits at most this long (or --send-timeout, if shorter).
PROBE_TIMEOUT_S = 5.0
# Keep-alive connections to one peer site at most.
PEER_CONNECTIONS = 8
# Items taken from a queue in one go at most.
POP_BATCH = 64

_T = TypeVar("_T")


@dataclass
class Site:
    """Everything a running daemon holds, built by :func:`open_site`."""

    settings: Settings
    twin: int
    redis: aioredis.Redis
    # The HTTP door's own connections: a burst of peers' messages cannot take the daemon's.
    door_redis: aioredis.Redis
    http: HttpClients
    store: Store
    signer: Signer
    # What leaves this site: send-queue entries read into envelopes, POSTs, and the retry schedule.
    items: SendItems
    posts: PostClient
    schedule: Schedule
    door: Door
    clock: Callable[[], float]
    metrics: Metrics
    events: EventLog
    # Links to other msgbus sites (None: --no-links).
    links: Links | None = None


# A Redis host that vanishes without closing the connection is noticed within about 25 s.
REDIS_KEEPALIVE = {socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3}


def open_redis(settings: Settings, max_connections: int, wait_s: float | None = None) -> aioredis.Redis:
    """A Redis client of the daemon with at most ``max_connections``; when all are in use, a command waits
    for one (up to ``wait_s``, None: as long as it takes) instead of failing with "Too many connections".

    No socket timeout: redis-py would wrap every command in a timer (a third of its cost per command), and
    blocking pops would need their own; TCP keepalive finds a dead host, and /healthz (its ping has a
    deadline) reports a Redis that stopped answering."""
    options: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": 5}
    options["health_check_interval"] = 30
    if not settings.redis_url.startswith("unix:"):
        options |= {"socket_keepalive": True, "socket_keepalive_options": REDIS_KEEPALIVE}
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=max_connections, timeout=wait_s, **options
    )
    return aioredis.Redis.from_pool(pool)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket up front so a port in use is a clear start-up error. ``::`` is dual-stack."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        raise StartupError(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from exc
    # Accepted connections inherit this: an answer written in parts must not wait for the peer's ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def open_http(settings: Settings) -> HttpClients:
    """The keep-alive HTTP client to other sites (each destination's sender uses one connection at a time;
    replies and probes may use a second)."""
    return HttpClients(settings.send_timeout_s, per_origin=PEER_CONNECTIONS)


class Daemon:
    def __init__(self, site: Site, sock: socket.socket) -> None:
        self.site = site
        self._sock = sock
        self._stopping = asyncio.Event()
        self._abort = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._server: QuietServer | None = None
        self.ready = asyncio.Event()
        self.peers = Peers(
            site.store,
            site.items,
            site.schedule,
            site.posts,
            site.signer,
            self._spawn,
            self._stopping,
            links=site.links,
            probe_s=site.settings.probe_interval_s,
            workers=site.settings.workers,
            clock=site.clock,
            metrics=site.metrics,
            events=site.events,
        )
        self.handlers = Handlers(
            site.store, site.items, site.twin, self._kick_peers, site.clock, site.metrics, site.events
        )
        site.metrics.refresh = self._refresh_metrics
        site.door.deliver_replies = self.handlers.deliver_from_peers
        # When each loop last went round; /healthz reports a loop that stopped turning.
        self._heartbeats: dict[str, float] = {}
        # More work of this site (its companions), run until the daemon stops.
        self.companions: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []

    async def _refresh_metrics(self) -> None:
        metrics = self.site.metrics
        metrics.set_queue_lengths(await self.site.store.depths())
        metrics.set_inflight(len(self._inflight))
        metrics.set_peers_down(self.peers.down_count())
        metrics.set_links_open(self.site.links.open_count() if self.site.links is not None else 0)

    async def _health(self) -> dict[str, object]:
        problems: list[str] = []
        try:
            await self.site.redis.ping()
        except (RedisError, OSError) as exc:
            problems.append(f"redis unreachable: {exc}")
        now = time.monotonic()
        stale_s = 3 * self.site.settings.pop_block_s + 5
        for loop, beat in sorted(self._heartbeats.items()):
            if now - beat > stale_s:
                problems.append(f"loop {loop} has not run for {now - beat:.0f}s")
        return {"problems": problems, "twin": self.site.twin, "inflight": len(self._inflight)}

    def _beat(self, loop: str) -> None:
        self._heartbeats[loop] = time.monotonic()

    def _kick_peers(self, ready: Mapping[int, list[SendItem] | None]) -> None:
        for dst, items in ready.items():
            self.peers.kick(dst, items)

    def stop(self) -> None:
        """First call drains; a second aborts."""
        if self._stopping.is_set():
            log.warning("second stop signal: aborting; unfinished items stay queued for the next start")
            self._abort.set()
        else:
            log.info("stopping: draining in-flight work (up to %.0fs)", self.site.settings.drain_grace_s)
            self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True

    async def run(self) -> None:
        settings = self.site.settings
        await self.site.redis.set(keys.SITE_TWIN, self.site.twin)
        for queue in keys.SYSTEM_QUEUES:
            recovered = await self.site.store.recover(queue)
            if recovered:
                log.warning("recovered %d unfinished item(s) of %s from the previous run", recovered, queue)
        self._server = server(
            create_app(
                self.site.door,
                [
                    Route("/metrics", loopback_only(metrics_endpoint(self.site.metrics))),
                    Route("/healthz", loopback_only(healthz_endpoint(self._health))),
                ],
                self.site.links,
            ),
            settings.drain_grace_s,
            # A link carries a whole batch in one message; pings find a link that stalled.
            ws_max_size=self.site.door.max_message_bytes + 4096,
            ws_ping_interval=settings.link_ping_s,
            ws_ping_timeout=2 * settings.link_ping_s,
            ws_per_message_deflate=False,
        )
        handlers = self.handlers
        # Each queue is taken in batches, one batch after the other: requests reach each destination in
        # push order, and every batch is a few pipelined round trips to Redis.
        await self.peers.resume()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._consume_in_order(keys.LOCAL, handlers.local), name="consume local")
            group.create_task(self._consume_in_order(keys.REMOTE, handlers.remote), name="consume remote")
            group.create_task(self._consume_in_order(keys.REPLY, handlers.reply), name="consume reply")
            group.create_task(self._timers(), name="timers")
            group.create_task(self.site.events.run(self._stopping), name="event log")
            group.create_task(self._server.serve(sockets=[self._sock]), name="http")
            group.create_task(self._announce_ready(), name="ready")
            for companion in self.companions:
                group.create_task(
                    companion(self._stopping), name=getattr(companion, "__qualname__", "companion")
                )
            await self._stopping.wait()
        await self._drain()

    async def _announce_ready(self) -> None:
        while self._server is not None and not self._server.started:
            if self._stopping.is_set():
                return
            await asyncio.sleep(0.01)
        log.info(
            "msgbusd ready: twin %s, listening on %s:%s, redis %s",
            self.site.twin,
            self.site.settings.listen_host,
            self.site.settings.listen_port,
            _redacted(self.site.settings.redis_url),
        )
        self.ready.set()

    async def _drain(self) -> None:
        pending = {t for t in self._inflight if not t.done()}
        if pending:
            log.info("waiting for %d in-flight item(s)", len(pending))
            all_done = asyncio.ensure_future(asyncio.wait(pending))
            abort = asyncio.ensure_future(self._abort.wait())
            await asyncio.wait(
                [all_done, abort],
                timeout=self.site.settings.drain_grace_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            all_done.cancel()
            abort.cancel()
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        # Items whose hand-off did not complete go back to the head of their queues right away.
        for queue in keys.SYSTEM_QUEUES:
            with contextlib.suppress(RedisError):
                await self.site.store.recover(queue)

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.create_task(self._in_task(work, what))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _in_task(self, work: Coroutine[Any, Any, None], what: str) -> None:
        await self._guarded(work, what)

    async def _guarded(self, work: Coroutine[Any, Any, None], what: str) -> bool:
        """Run ``work``, logging what it raises; False if it did not complete."""
        try:
            await work
        except RedisError as exc:
            self.site.metrics.error("redis")
            log.error("%s: redis failed (%s); the item stays queued for a later attempt", what, exc)
        except Exception:
            log.exception("%s: unexpected failure; the item stays queued", what)
        else:
            return True
        return False

    async def _consume_in_order(self, queue: str, handle: Callable[[list[bytes]], Awaitable[None]]) -> None:
        """Take items in batches and handle each batch before the next, keeping queue order.

        After a Redis failure, whatever is in the queue's processing list is taken back first: a pop whose
        answer Redis did not send before it went away (a restart does not flush its answers) left items
        there that this loop never saw, and so does a batch given up for Redis failing."""
        failures = 0
        orphans = False
        while not self._stopping.is_set():
            self._beat(queue)
            try:
                if orphans:
                    await self._take_back(queue)
                    orphans = False
                batch = await self.site.store.take(queue, POP_BATCH, self.site.settings.pop_block_s)
            except (RedisError, OSError) as exc:
                failures += 1
                orphans = True
                await self._pop_failed(queue, exc, failures)
                continue
            failures = 0
            if batch:
                orphans = not await self._guarded(
                    self._with_redis_retry(handle, batch), f"items from {queue}"
                )

    async def _take_back(self, queue: str) -> None:
        taken_back = await self.site.store.recover(queue)
        if taken_back:
            log.warning(
                "took back %d item(s) of %s that a lost Redis answer left in its processing list",
                taken_back,
                queue,
                extra=about(queue=queue),
            )

    async def _pop_failed(self, queue: str, exc: Exception, failures: int) -> None:
        delay = REDIS_RECONNECT.delay_s(failures)
        log.error("cannot pop %s: %s; retrying in %.1fs", queue, exc, delay)
        await self._sleep_unless_stopping(delay)

    async def _with_redis_retry(self, handle: Callable[[_T], Awaitable[None]], item: _T) -> None:
        """Run ``handle`` on an item; while Redis is unreachable, try again with backoff until stopping.

        Every hand-off is a script that does nothing for an item already handed off, so a retry after an
        answer lost with the connection does not hand anything off twice.
        """
        failures = 0
        while True:
            try:
                await handle(item)
                return
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self._stopping.is_set():
                    raise
                failures += 1
                delay = REDIS_RECONNECT.delay_s(failures)
                log.warning("redis unreachable while handling an item (%s); again in %.1fs", exc, delay)
                await self._sleep_unless_stopping(delay)

    async def _timers(self) -> None:
        schedule = self.site.schedule
        settings = self.site.settings
        while not self._stopping.is_set():
            self._beat("timers")
            try:
                # Re-sends go back to their destinations' senders, which send them in batches.
                destinations, more_due = await schedule.release_due()
                for dst in destinations:
                    self.peers.kick(dst)
                expired = await schedule.expire_due() == CLAIM_BATCH
                if more_due or expired:
                    continue  # more is due: go on without waiting for the next tick
            except (RedisError, OSError) as exc:
                self.site.metrics.error("redis")
                log.error("retry/expiry timer: redis failed (%s)", exc)
            await self._sleep_unless_stopping(settings.tick_s)

    async def _sleep_unless_stopping(self, delay_s: float) -> None:
        await sleep_unless(self._stopping, delay_s)


def _redacted(url: str) -> str:
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, _credentials = head.partition("://")
    return f"{scheme}://***@{tail}"


async def open_site(
    settings: Settings, signer: Signer, resolver: Resolver, clock: Callable[[], float] = time.time
) -> Site:
    """Connect to Redis, find our twin id, and wire the parts together."""
    redis = open_redis(settings, settings.redis_connections)
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        await redis.aclose()
        raise StartupError(f"cannot connect to Redis at {_redacted(settings.redis_url)}: {exc}") from exc
    twin = settings.twin
    if twin is None:
        from twin_resolver.accounts import ss58_encode
        from twin_resolver.base import ResolverError

        try:
            twin = await resolver.twin_id_by_public_key(signer.public_key)
        except ResolverError as exc:
            await redis.aclose()
            raise StartupError(
                f"no twin found for this key ({ss58_encode(signer.public_key)}): {exc}; pass --twin N"
            ) from exc
    http = open_http(settings)
    store = Store(redis)
    backoff = Backoff(settings.retry_delay_s, settings.retry_max_delay_s)
    metrics = Metrics()
    if isinstance(resolver, CachedResolver):
        metrics.watch_twin_cache(resolver.stats)
    events = EventLog(
        settings.event_log_dir,
        twin,
        max_bytes=settings.event_log_max_bytes,
        rotate_s=settings.event_log_rotate_s,
        clock=clock,
    )
    # --max-message-size is the largest payload: HTTP bodies carry it base64-encoded in an envelope.
    max_body_bytes = envelope_size_limit(settings.max_message_bytes)
    door_redis = open_redis(settings, settings.redis_connections, wait_s=settings.door_redis_wait_s)
    door = Door(
        Store(door_redis),
        resolver,
        signer,
        settings.freshness_s,
        clock,
        metrics,
        twin,
        events=events,
        max_message_bytes=max_body_bytes,
        rate_limit=TokenBuckets(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None,
    )
    links = None
    if settings.links:
        links = Links(
            twin,
            signer,
            resolver,
            http,
            functools.partial(answer_link_frame, door),
            timeout_s=settings.send_timeout_s,
            ping_s=settings.link_ping_s,
            max_frame_bytes=max_body_bytes,
        )
    posts = PostClient(
        http,
        resolver,
        clock,
        metrics,
        max_batch_bytes=max_body_bytes,
        probe_timeout_s=min(settings.send_timeout_s, PROBE_TIMEOUT_S),
    )
    items = SendItems(store, twin)
    schedule = Schedule(
        store,
        items,
        backoff=backoff,
        hold_offline=settings.hold_offline,
        clock=clock,
        metrics=metrics,
        events=events,
    )
    return Site(
        settings,
        twin,
        redis,
        door_redis,
        http,
        store,
        signer,
        items,
        posts,
        schedule,
        door,
        clock,
        metrics,
        events,
        links,
    )


async def close_site(site: Site) -> None:
    if site.links is not None:
        await site.links.aclose()
    site.events.close()
    await site.http.aclose()
    await site.door_redis.aclose()
    await site.redis.aclose()


async def serve(
    settings: Settings, signer: Signer, resolver: Resolver, companions: Sequence[Companion] = ()
) -> None:
    """Run a site, and the ``companions`` beside it, until stopped by a signal. Raises
    :class:`StartupError` for operator mistakes."""
    sock = bind_socket(settings.listen_host, settings.listen_port)
    try:
        site = await open_site(settings, signer, resolver)
    except BaseException:
        sock.close()
        for companion in companions:
            await companion.aclose()
        raise
    daemon = Daemon(site, sock)
    handle = SiteHandle(
        twin=site.twin,
        resolver=resolver,
        metrics=site.metrics,
        submit=daemon.handlers.submit,
        withdraw=site.store.withdraw,
        open_redis=functools.partial(open_redis, settings),
    )
    loop = asyncio.get_running_loop()
    try:
        for companion in companions:
            companion.attach(handle)
            daemon.companions.append(companion.run)
        if settings.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, daemon.stop)
        await daemon.run()
    finally:
        if settings.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        sock.close()
        for companion in companions:
            await companion.aclose()
        await close_site(site)
        log.info("msgbusd stopped")
