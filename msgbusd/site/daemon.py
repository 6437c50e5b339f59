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
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp

from msgbusd.door.handlers import Handlers
from msgbusd.door.http_api import Door, answer_link_frame, create_app, dedup_ttl_s, loopback_only, seen_id
from msgbusd.door.rate_limit import TokenBuckets
from msgbusd.door.relaying import Relaying
from msgbusd.errors import StartupError
from msgbusd.identity.sealing import Sealer, SealError, public_key_of
from msgbusd.identity.signing import Signer
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_admission import LinkAdmission
from msgbusd.link.links import Links
from msgbusd.link.peer_clocks import PeerClocks
from msgbusd.link.site_socket import SiteSocketSettings, site_sockets
from msgbusd.link.way_back import WayBack
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.loop_lag import collector_pauses, watch_loop_lag
from msgbusd.reports.metrics import Metrics, healthz_endpoint, metrics_endpoint
from msgbusd.reports.site_warnings import SiteWarnings
from msgbusd.sending.peers import Peers
from msgbusd.sending.posts import PostClient
from msgbusd.sending.schedule import CLAIM_BATCH, Schedule
from msgbusd.sending.send_items import SendItems
from msgbusd.site.companions import Companion, SiteHandle
from msgbusd.site.garbage import LongLived, collect_cycles_until, settle_after_start_up
from msgbusd.site.inflight import InFlight
from msgbusd.site.instance import Instance
from msgbusd.site.memory import release_free_memory_until
from msgbusd.site.open_files import raise_open_files_limit
from msgbusd.site.redis_memory import RedisMemory
from msgbusd.site.serving import QuietServer, bind_socket, serve_until, server
from msgbusd.site.settings import Settings
from msgbusd.site.status import STATUS_TIMEOUT_S, StatusEndpoint, StatusReport
from msgbusd.store.instances import InstanceStore
from msgbusd.store.leases import Leases
from msgbusd.store.queues import Store
from msgbusd.store.replication import Replication, ReplicationError
from twin_resolver.base import Resolver, ResolverError
from twin_resolver.cache import CachedResolver
from wire import keys
from wire.backoff import Backoff, sleep_unless
from wire.envelope import envelope_size_limit
from wire.redis_url import async_client, redacted
from wire.reliable_list import ReliableList, consume_in_order

log = logging.getLogger("msgbusd")

# A probe of a peer that does not answer waits at most this long (or --send-timeout, if shorter).
PROBE_TIMEOUT_S = 5.0
# Keep-alive connections to one peer site at most.
PEER_CONNECTIONS = 8
# Items taken from a queue in one go at most.
POP_BATCH = 64
# How often a process that helps another take a system queue looks whether it is falling behind.
HELP_POLL_S = 0.1
# The health check's ping of Redis: an answer is due well within the callers' own timeouts.
REDIS_PING_TIMEOUT_S = 1.0


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
    clock: Callable[[], float]
    metrics: Metrics
    events: EventLog
    inflight: InFlight
    # What leaves this site: send-queue entries read into envelopes, the retry schedule, and the peers,
    # which send over links to other msgbus sites (None: --no-links) or with POSTs.
    items: SendItems
    schedule: Schedule
    posts: PostClient
    links: Links | None
    peers: Peers
    # What arrives: the items of the system queues, and the HTTP door for other sites.
    handlers: Handlers
    door: Door
    # This process among the site's instances, and the leases (site-wide jobs) it holds.
    instance: Instance
    leases: Leases
    # What the operator should act on though the bus works: shown by /status, not failing /healthz.
    warnings: SiteWarnings = field(default_factory=SiteWarnings)


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
    return async_client(settings.redis_url, max_connections=max_connections, wait_s=wait_s, **options)


def open_http(settings: Settings) -> HttpClients:
    """The keep-alive HTTP client to other sites (each destination's sender uses one connection at a time;
    replies and probes may use a second)."""
    return HttpClients(settings.send_timeout_s, per_origin=PEER_CONNECTIONS)


class Daemon:
    def __init__(self, site: Site, sock: socket.socket, metrics_sock: socket.socket | None = None) -> None:
        self.site = site
        self._sock = sock
        # This process's own address for its reports (--metrics-listen).
        self._metrics_sock = metrics_sock
        self._stopping = site.inflight.stopping
        self._server: QuietServer | None = None
        self.ready = asyncio.Event()
        # When each loop last went round; /healthz reports a loop that stopped turning.
        self._heartbeats: dict[str, float] = {}
        self._started_at = time.time()
        # More work of this site (its companions), run until the daemon stops.
        self.companions: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []

    async def _refresh_metrics(self) -> None:
        site = self.site
        site.metrics.set_queue_lengths(await site.store.depths())
        site.metrics.set_overdue(await site.store.overdue(site.clock()))
        site.metrics.set_inflight(len(site.inflight))
        site.metrics.set_peers_down(site.peers.down_count())
        site.metrics.set_senders(*site.peers.sender_places())
        site.metrics.set_links_open(site.links.open_count() if site.links is not None else 0)
        site.metrics.set_site_instances(len(site.instance.live))

    async def _health(self) -> dict[str, object]:
        return {
            "problems": await self._problems(),
            "twin": self.site.twin,
            "inflight": len(self.site.inflight),
        }

    async def _problems(self) -> list[str]:
        problems: list[str] = []
        if not self.site.instance.fresh():
            problems.append("no heartbeat in redis lately: other instances may take this one's work over")
        try:
            async with asyncio.timeout(REDIS_PING_TIMEOUT_S):
                await self.site.redis.ping()
        except TimeoutError:
            problems.append(f"redis unreachable: no answer within {REDIS_PING_TIMEOUT_S:g}s")
        except (RedisError, OSError) as exc:
            problems.append(f"redis unreachable: {exc}")
        now = time.monotonic()
        stale_s = 3 * self.site.settings.pop_block_s + 5
        for loop, beat in sorted(self._heartbeats.items()):
            if now - beat > stale_s:
                problems.append(f"loop {loop} has not run for {now - beat:.0f}s")
        return problems

    def _status_report(self) -> StatusReport:
        site = self.site
        return StatusReport(
            twin=site.twin,
            peers=site.peers,
            links=site.links,
            inflight=lambda: len(site.inflight),
            traffic=site.metrics.recent,
            problems=self._problems,
            started_at=self._started_at,
            warnings=site.warnings.current,
        )

    def _report_routes(self, guard: Callable[[ASGIApp], ASGIApp]) -> list[Route]:
        """What the site reports of this process, each endpoint behind ``guard``."""
        return [
            Route("/metrics", guard(metrics_endpoint(self.site.metrics, self._refresh_metrics))),
            Route("/healthz", guard(healthz_endpoint(self._health))),
            Route("/status", guard(StatusEndpoint(self._status_report(), STATUS_TIMEOUT_S))),
        ]

    def _beat(self, loop: str) -> None:
        self._heartbeats[loop] = time.monotonic()

    def stop(self) -> None:
        """First call drains; a second aborts."""
        self.site.leases.stop()
        if self._stopping.is_set():
            log.warning("second stop signal: aborting; unfinished items stay queued for the next start")
            self.site.inflight.abort.set()
        else:
            log.info("stopping: draining in-flight work (up to %.0fs)", self.site.settings.drain_grace_s)
            self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True

    async def run(self) -> None:
        site = self.site
        settings = site.settings
        redis_memory = RedisMemory(site.redis, redacted(settings.redis_url), metrics=site.metrics)
        site.warnings.add(redis_memory.warnings)
        if not await redis_memory.start(lambda: site.redis.set(keys.SITE_TWIN, site.twin), self._stopping):
            return
        link_sockets = SiteSocketSettings(
            site.links.serve if site.links is not None else None,
            # A link carries a whole batch in one message.
            max_message_bytes=site.door.max_message_bytes + 4096,
            admission=LinkAdmission(
                settings.link_handshakes_per_s, on_turned_away=site.metrics.link_turned_away
            ),
        )
        self._server = server(
            create_app(site.door, self._report_routes(loopback_only)),
            settings.drain_grace_s,
            ws=site_sockets(link_sockets),
        )
        handlers = site.handlers
        await self._take_back_single_lists()
        await site.instance.join()
        settle_after_start_up()
        leases, stopping = site.leases, self._stopping
        with collector_pauses(site.metrics):
            async with asyncio.TaskGroup() as group:
                group.create_task(
                    leases.run_while_held(
                        keys.LOCAL_LEASE,
                        self._while_held(
                            keys.LOCAL, functools.partial(self._consume, keys.LOCAL, handlers.local)
                        ),
                        stopping,
                    ),
                    name="consume local",
                )
                group.create_task(
                    self._consume(keys.REMOTE, handlers.remote, stopping), name="consume remote"
                )
                group.create_task(
                    leases.run_while_held(
                        keys.REPLY_LEASE,
                        self._while_held(
                            keys.REPLY, functools.partial(self._consume, keys.REPLY, handlers.reply)
                        ),
                        stopping,
                        meanwhile=functools.partial(self._consume, keys.REPLY, handlers.reply, helping=True),
                    ),
                    name="consume reply",
                )
                group.create_task(
                    leases.run_while_held(
                        keys.TIMERS_LEASE, self._while_held("timers", self._timers), stopping
                    ),
                    name="timers",
                )
                group.create_task(site.instance.run(stopping), name="heartbeat")
                group.create_task(site.instance.listen(stopping), name="wake channel")
                group.create_task(site.events.run(self._stopping), name="event log")
                group.create_task(release_free_memory_until(stopping), name="free memory")
                group.create_task(collect_cycles_until(stopping), name="cycles")
                group.create_task(watch_loop_lag(site.metrics, stopping), name="loop lag")
                group.create_task(redis_memory.watch(stopping), name="redis memory")
                if site.links is not None:
                    group.create_task(site.links.close_idle_until(stopping), name="idle links")
                    group.create_task(site.links.ping_until(stopping), name="link pings")
                    group.create_task(self._reopen_ways_back(site.links), name="ways back")
                    if site.links.keeps_links:
                        group.create_task(site.links.keep_uplinks(stopping), name="uplinks")
                group.create_task(self._server.serve(sockets=[self._sock]), name="http")
                if self._metrics_sock is not None:
                    reports = Starlette(routes=self._report_routes(lambda app: app))
                    group.create_task(
                        serve_until(reports, self._metrics_sock, stopping, settings.drain_grace_s),
                        name="reports",
                    )
                group.create_task(self._announce_ready(), name="ready")
                for companion in self.companions:
                    group.create_task(
                        companion(self._stopping), name=getattr(companion, "__qualname__", "companion")
                    )
                await self._stopping.wait()
        await self._drain()

    async def _reopen_ways_back(self, links: Links) -> None:
        try:
            await links.reopen_ways_back(self.site.store.awaited_answers, self.site.clock())
        except (RedisError, OSError) as exc:
            log.warning("could not read which twins this site waits for answers from: %s", exc)

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
            redacted(self.site.settings.redis_url),
        )
        self.ready.set()

    async def _drain(self) -> None:
        await self.site.inflight.finish(self.site.settings.drain_grace_s)
        # Items whose hand-off did not complete go back to the head of their queues right away.
        for queue in keys.SYSTEM_QUEUES:
            with contextlib.suppress(RedisError):
                await self._system_list(queue).take_back()
        await self.site.instance.leave()

    async def _take_back_single_lists(self) -> None:
        """What a release with one processing list per queue left there goes back to its queue."""
        for queue in keys.SYSTEM_QUEUES:
            single = ReliableList(self.site.redis, queue, keys.processing(queue), oldest="LEFT")
            if moved := await single.take_back():
                log.warning("took back %d unfinished item(s) of %s left by an older release", moved, queue)

    def _system_list(self, queue: str) -> ReliableList:
        guard = self.site.handlers.staging if queue == keys.LOCAL else None
        processing = self.site.store.processing(queue)
        return ReliableList(self.site.redis, queue, processing, oldest="LEFT", take_back_guard=guard)

    def _while_held(
        self, loop: str, work: Callable[[asyncio.Event], Awaitable[None]]
    ) -> Callable[[asyncio.Event], Awaitable[None]]:
        """``work`` under a lease: while the lease is elsewhere its loop is not expected to turn."""

        async def held(lost: asyncio.Event) -> None:
            try:
                await work(lost)
            finally:
                self._heartbeats.pop(loop, None)

        return held

    async def _consume(
        self,
        queue: str,
        handle: Callable[[list[bytes]], Awaitable[None]],
        until: asyncio.Event,
        *,
        helping: bool = False,
    ) -> None:
        """Take a system queue in batches, one batch after the other, until ``until`` is set: requests reach
        each destination in push order, and every batch is a few pipelined round trips to Redis. ``helping``:
        another process takes the queue; take only while a batch or more waits."""

        async def counted(batch: list[bytes]) -> None:
            try:
                await handle(batch)
            except RedisError:
                self.site.metrics.error("redis")
                raise

        await consume_in_order(
            self._system_list(queue),
            counted,
            until,
            batch=POP_BATCH,
            block_s=HELP_POLL_S if helping else self.site.settings.pop_block_s,
            turned=functools.partial(self._beat, queue),
            retry_soon=(ReplicationError,),
            behind=POP_BATCH if helping else 0,
        )

    async def _timers(self, lost: asyncio.Event) -> None:
        """The retry and expiry timers, run by the instance that holds their lease until it goes."""
        schedule = self.site.schedule
        settings = self.site.settings
        while not lost.is_set():
            self._beat("timers")
            try:
                # Re-sends go back to their destinations' senders, which send them in batches.
                destinations, more_due = await schedule.release_due()
                for dst in destinations:
                    self.site.peers.kick(dst)
                expired = await schedule.expire_due() == CLAIM_BATCH
                if more_due or expired:
                    continue  # more is due: go on without waiting for the next tick
            except (RedisError, OSError) as exc:
                self.site.metrics.error("redis")
                log.error("retry/expiry timer: redis failed (%s)", exc)
            await sleep_unless(lost, settings.tick_s)


async def open_site(
    settings: Settings, signer: Signer, resolver: Resolver, clock: Callable[[], float] = time.time
) -> Site:
    """Connect to Redis, find our twin id, and make the parts of the site, each from the ones before it."""
    redis = open_redis(settings, settings.redis_connections)
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        await redis.aclose()
        raise StartupError(f"cannot connect to Redis at {redacted(settings.redis_url)}: {exc}") from exc
    twin = settings.twin
    if twin is None:
        from twin_resolver.accounts import ss58_encode

        try:
            twin = await resolver.twin_id_by_public_key(signer.public_key)
        except ResolverError as exc:
            await redis.aclose()
            raise StartupError(
                f"no twin found for this key ({ss58_encode(signer.public_key)}): {exc}; pass --twin N"
            ) from exc
    instance_id = settings.instance or f"{socket.gethostname()}:{os.getpid()}"
    metrics = Metrics()
    metrics.label_instance(instance_id)
    if isinstance(resolver, CachedResolver):
        metrics.watch_twin_cache(resolver.stats)
    events = EventLog(
        settings.event_log_dir,
        twin,
        max_bytes=settings.event_log_max_bytes,
        rotate_s=settings.event_log_rotate_s,
        clock=clock,
        metrics=metrics,
    )
    inflight = InFlight(metrics)
    replication = Replication(settings.redis_wait_replicas)
    store = Store(redis, instance_id, replication)
    leases = Leases(instance_id)
    http = open_http(settings)
    # --max-message-size is the largest payload: HTTP bodies carry it base64-encoded in an envelope.
    max_body_bytes = envelope_size_limit(settings.max_message_bytes)

    items = SendItems(store, twin)
    schedule = Schedule(
        store,
        items,
        backoff=Backoff(settings.retry_delay_s, settings.retry_max_delay_s),
        hold_offline=settings.hold_offline,
        clock=clock,
        metrics=metrics,
        events=events,
    )
    # The peers' clocks: measured at each link's handshake and from the Date of POSTs' answers.
    clocks = PeerClocks(clock, metrics)
    posts = PostClient(
        http,
        resolver,
        clock,
        metrics,
        max_batch_bytes=max_body_bytes,
        probe_timeout_s=min(settings.send_timeout_s, PROBE_TIMEOUT_S),
        clocks=clocks,
        has_links=settings.links,
    )

    # The one part used before it is made: the door (below) answers what peers send over links. It hands
    # replies to the handlers, which wake the peers, which send over the links.
    async def answer_on_link(
        peer: int, messages: list[object], through_relay: bool
    ) -> list[dict[str, object]]:
        return await answer_link_frame(door, peer, messages, through_relay=through_relay)

    sealer = Sealer(signer.encryption_key())
    own_relay = await _own_relay(resolver, twin, sealer)
    if own_relay and not settings.links:
        log.error(
            "this site's twin entry names the relay %s, but with --no-links it keeps no link to it", own_relay
        )
    way_back = WayBack(twin, resolver)
    links = None
    if settings.links:
        links = Links(
            twin,
            signer,
            resolver,
            http,
            answer_on_link,
            timeout_s=settings.send_timeout_s,
            ping_s=settings.link_ping_s,
            idle_s=settings.link_idle_s,
            max_links=settings.max_links,
            uplinks=settings.uplinks,
            relay=own_relay,
            relays_for_others=settings.relay,
            way_back=way_back,
            max_frame_bytes=max_body_bytes,
            clocks=clocks,
            on_new_link=LongLived().made,
        )
    peers = Peers(
        store,
        items,
        schedule,
        posts,
        signer,
        sealer,
        resolver,
        inflight.spawn,
        inflight.stopping,
        links=links,
        leases=leases,
        probe_s=settings.probe_interval_s,
        probe_rate=settings.probe_rate,
        workers=settings.workers,
        link_after=settings.link_after,
        large_message_bytes=settings.large_message_bytes,
        way_back=way_back,
        clock=clock,
        metrics=metrics,
        events=events,
    )
    if links is not None:
        links.uplink_record.on_uplink = peers.uplink_opened

    _send_when_held(leases, peers)
    handlers = Handlers(store, items, twin, peers.kick_all, clock, metrics, events)
    door_redis = open_redis(settings, settings.redis_connections, wait_s=settings.door_redis_wait_s)
    door = Door(
        Store(door_redis, instance_id, replication),
        resolver,
        signer,
        settings.freshness_s,
        clock,
        metrics,
        twin,
        deliver_replies=handlers.deliver_from_peers,
        events=events,
        max_message_bytes=max_body_bytes,
        rate_limit=TokenBuckets(settings.rate_limit, settings.rate_burst) if settings.rate_limit else None,
        sealer=sealer,
        clocks=clocks,
    )
    if settings.relay:
        door.relaying = Relaying(
            door.store,
            resolver,
            peers.kick_all,
            seen_id=seen_id,
            dedup_ttl_s=dedup_ttl_s,
            freshness_s=settings.freshness_s,
            metrics=metrics,
            clock=clock,
            clocks=clocks,
        )
    site = Site(
        settings=settings,
        twin=twin,
        redis=redis,
        door_redis=door_redis,
        http=http,
        store=store,
        signer=signer,
        clock=clock,
        metrics=metrics,
        events=events,
        inflight=inflight,
        items=items,
        schedule=schedule,
        posts=posts,
        links=links,
        peers=peers,
        handlers=handlers,
        door=door,
        instance=Instance(
            InstanceStore(redis),
            leases,
            lease_s=settings.instance_lease_s,
            queues=keys.SYSTEM_QUEUES,
            pending=store.pending_destinations,
            describe=functools.partial(_describe, settings, metrics),
        ),
        leases=leases,
    )
    site.warnings.add(events.drops.warnings)
    if links is not None:
        links.uplink_record.on_uplink_change = site.instance.uplink_changed
    site.warnings.add(clocks.warnings)
    return site


async def _own_relay(resolver: Resolver, twin: int, sealer: Sealer) -> str:
    """The relay this site's own twin entry names (empty: none, or the entry cannot be read now); says so
    when other sites could not encrypt for this one with what the entry says."""
    try:
        own = await resolver.get_twin(twin)
    except ResolverError as exc:
        log.warning("couldn't read this site's own twin entry (%s): its relay, if any, is not dialed", exc)
        return ""
    if own.relay:
        try:
            published = public_key_of(own)
        except SealError:
            published = None
        if published != sealer.public_key:
            log.error(
                "this site's twin entry names the relay %s, but other sites cannot encrypt for it with what "
                "the entry says: its pk must be %s (msgbus identity prints it)",
                own.relay,
                sealer.public_key.hex(),
            )
    return own.relay


def _describe(settings: Settings, metrics: Metrics) -> dict[str, str]:
    """What an instance says of itself at each heartbeat, for ``msgbus status``."""
    traffic = metrics.recent.snapshot()
    return {
        "listen": f"{settings.listen_host}:{settings.listen_port}",
        "lease": f"{settings.instance_lease_s:g}",
        "sent_per_s": f"{traffic.sent_per_s:g}",
        "received_per_s": f"{traffic.received_per_s:g}",
    }


def _send_when_held(leases: Leases, peers: Peers) -> None:
    """A destination's lease gained starts its sender (one taken over probes first), as does work another
    instance announces for it; one going wakes it, so that it stops."""

    def gained(name: str, resumed: bool) -> None:
        if name.isdigit():
            peers.gained(int(name), resumed=resumed)

    def elsewhere(name: str) -> None:
        if name.isdigit():
            peers.held_elsewhere(int(name))

    def told(name: str, carried: bytes | None) -> None:
        if name.isdigit():
            peers.kick_carried(int(name), carried)

    def leaving(name: str) -> None:
        if name.isdigit():
            peers.wake(int(name))

    def still_held(name: str) -> None:
        if name.isdigit():
            peers.unattended(int(name))

    leases.on_gained = gained
    leases.on_told = told
    leases.on_elsewhere = elsewhere
    leases.on_still_held = still_held
    leases.on_leaving = leaving


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
    raise_open_files_limit()
    sock = bind_socket(settings.listen_host, settings.listen_port, reuse_port=settings.reuse_port)
    metrics_sock = None
    try:
        if settings.metrics_listen is not None:
            metrics_sock = bind_socket(*settings.metrics_listen)
        site = await open_site(settings, signer, resolver)
    except BaseException:
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()
        for companion in companions:
            await companion.aclose()
        raise
    daemon = Daemon(site, sock, metrics_sock)
    handle = SiteHandle(
        twin=site.twin,
        resolver=resolver,
        metrics=site.metrics,
        submit=site.handlers.submit,
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
        if metrics_sock is not None:
            metrics_sock.close()
        for companion in companions:
            await companion.aclose()
        await close_site(site)
        log.info("msgbusd stopped")
