"""Prometheus metrics of one msgbusd, and the ``/metrics`` and ``/healthz`` endpoints.

Each :class:`Metrics` owns its own registry (never prometheus-client's global one), so several daemons, or
tests, can live in one process. Counters and histograms are updated where things happen; the gauges (queue
lengths, in-flight work, peers down) are set by the daemon's ``refresh``, awaited at each scrape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Literal, TypeVar, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from msgbusd.reports.recent_traffic import RecentTraffic
from twin_resolver.cache import CacheStats

log = logging.getLogger("msgbusd.metrics")

# A `*_created` series per counter and histogram doubles what Prometheus stores, and nothing reads them
# (rates and increases need only the counters). This is prometheus-client's switch for the whole process.
disable_created_metrics()  # type: ignore[no-untyped-call]

MessageEvent = Literal[
    "accepted",  # a local request taken from msgbus.system.local (once per destination)
    "sent",  # a request POSTed to a peer and accepted by it
    "received",  # a request from a peer, queued for a local service
    "duplicate",  # a request from a peer that was queued already
    "delivered_to_service",  # a request pushed onto msgbus.<cmd>
    "reply_received",  # a reply from a peer, for one of our requests
    "reply_sent",  # a local service's reply POSTed back to the twin that asked
    "delivered_to_caller",  # a reply or an error pushed onto a caller's return queue
    "retried",  # a re-send after a failed attempt
    "probed",  # a probe of a peer that is down
    "expired",  # a request whose lifetime ended without a reply
    "failed",  # a request whose tries are all spent
    "rejected",  # an invalid request or a refused HTTP call
    "dead_lettered",  # an item set aside in msgbus.system.deadletter
    "relayed",  # a message for a twin this site relays, queued for it (--relay)
    "relay_forwarded",  # a relayed message sent on to its twin
]
ErrorCause = Literal[
    "unreachable",
    "busy",
    "refused",
    "not_found",
    "invalid",
    "signature",
    "too_old",
    "too_large",
    "rate_limited",
    "forged_reply",
    "redis",
    "other",
]
SendPath = Literal["remote", "reply", "link"]
# Why the event log dropped events (see msgbusd/reports/event_log_drops.py).
EventLogDrop = Literal[
    "no_space",  # ENOSPC, EDQUOT: the disk, or the user's quota, is full
    "read_only",  # EROFS
    "permission",  # EACCES, EPERM
    "missing",  # ENOENT: the file being written was removed (its directory with it)
    "not_a_directory",  # ENOTDIR, EISDIR: a file where the directory should be
    "io_error",  # EIO
    "behind",  # events came faster than they could be written
    "other",
]

MESSAGE_EVENTS: tuple[MessageEvent, ...] = get_args(MessageEvent)
# The events that count messages crossing to another site, for the last minute's rates ("received" counts
# every message from another site, requests and replies).
_OUTGOING: frozenset[MessageEvent] = frozenset({"sent", "reply_sent"})
ERROR_CAUSES: tuple[ErrorCause, ...] = get_args(ErrorCause)
SEND_PATHS: tuple[SendPath, ...] = get_args(SendPath)
EVENT_LOG_DROPS: tuple[EventLogDrop, ...] = get_args(EventLogDrop)

# A POST is bounded by --send-timeout (10 s by default).
SEND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A round trip includes the service's work and any re-sends, up to the request's lifetime (3600 s default).
ROUND_TRIP_BUCKETS = (*SEND_BUCKETS[2:], 60.0, 300.0, 3600.0)
# How late the event loop ran, and how long the collector stopped it: 0.1 s is a stall a caller notices.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
REFRESH_TIMEOUT_S = 5.0

# The twin cache's counters, as labels of msgbus_twin_cache_total.
TWIN_CACHE_COUNTS = ("lookups", "hits", "negative_hits", "fetches", "failures", "stale_served")

Refresh = Callable[[], Awaitable[None]]
_Label = TypeVar("_Label", bound=str)
HealthCheck = Callable[[], Awaitable[dict[str, object]]]


class Metrics:
    """The metrics of one daemon, in a registry of their own.

    A scrape may first await a ``refresh`` that sets the gauges (:meth:`scrape`), typically with
    :meth:`set_queue_lengths`, :meth:`set_inflight` and :meth:`set_peers_down`. :attr:`recent` keeps the
    last minute of traffic and round trips for ``/status``.
    """

    def __init__(self, *, refresh_timeout_s: float = REFRESH_TIMEOUT_S) -> None:
        self.registry = CollectorRegistry()
        self.recent = RecentTraffic()
        self.refresh_timeout_s = refresh_timeout_s
        reg = self.registry
        self.messages = Counter(
            "msgbus_messages", "Messages by what happened to them.", ["event"], registry=reg
        )
        self.errors = Counter("msgbus_errors", "Failures by cause.", ["cause"], registry=reg)
        self.send_queue_reads = Counter(
            "msgbus_send_queue_reads",
            "Batches a sender read from its send queue in Redis rather than sending what it was handed "
            "(after a restart or fault, while a peer is back with a backlog, or out of step with its queue).",
            registry=reg,
        )
        self.event_log_dropped = Counter(
            "msgbus_event_log_dropped",
            "Events the event log dropped because it could not write them (the messages are carried as "
            "usual), by reason.",
            ["reason"],
            registry=reg,
        )
        self.send_seconds = Histogram(
            "msgbus_send_seconds",
            "Duration of sends to other sites: HTTP POSTs (remote: requests, reply: replies), and frames "
            "over links until their ack (link).",
            ["path"],
            buckets=SEND_BUCKETS,
            registry=reg,
        )
        self.round_trip_seconds = Histogram(
            "msgbus_round_trip_seconds",
            "From a local request's acceptance to its reply's delivery to the caller.",
            buckets=ROUND_TRIP_BUCKETS,
            registry=reg,
        )
        self.queue_length = Gauge(
            "msgbus_queue_length",
            "Items in a system queue, or entries in the backlog.",
            ["queue"],
            registry=reg,
        )
        self.inflight = Gauge("msgbus_inflight", "Items being handled right now.", registry=reg)
        self.overdue = Gauge(
            "msgbus_requests_overdue",
            "Requests past their deadline with no outcome yet (the expiry timer answers them within a tick).",
            registry=reg,
        )
        self.peers_down = Gauge(
            "msgbus_peers_down", "Peers whose site does not answer (probed until it does).", registry=reg
        )
        self.links_open = Gauge(
            "msgbus_links_open", "Open links to other msgbus sites (either side opened them).", registry=reg
        )
        self.senders = Gauge(
            "msgbus_senders",
            "Senders of peers that answer (at most --workers; a peer that is down needs none).",
            registry=reg,
        )
        self.senders_waiting = Gauge(
            "msgbus_senders_waiting", "Twins with work waiting for a sender's place.", registry=reg
        )
        self.peer_clock_offset = Gauge(
            "msgbus_peer_clock_offset_seconds",
            "How far a peer's clock is ahead of this site's (negative: behind), for the peers found more "
            "than a few seconds off (measured at each link's handshake, or from a POST answer's Date).",
            ["peer"],
            registry=reg,
        )
        self.peers_clock_off = Gauge(
            "msgbus_peers_clock_off",
            "Peers whose clock is more than a few seconds off from this site's, as last measured.",
            registry=reg,
        )
        self.site_instances = Gauge(
            "msgbus_site_instances",
            "Live msgbusd processes of the site (sharing its Redis), as seen at the last heartbeat.",
            registry=reg,
        )
        self.redis_evicting = Gauge(
            "msgbus_redis_evicting",
            "1 if the site's Redis may evict keys, queued messages among them (its maxmemory-policy is not "
            "noeviction), 0 if not or not known; read at start and every 10 s.",
            registry=reg,
        )
        self.loop_lag_seconds = Histogram(
            "msgbus_event_loop_lag_seconds",
            "How much later than asked the daemon's event loop ran a timer (one every 50 ms): what kept it "
            "busy (a herd of handshakes, the cyclic collector) made everything else that late.",
            buckets=LAG_BUCKETS,
            registry=reg,
        )
        self.collector_pause_seconds = Histogram(
            "msgbus_gc_pause_seconds",
            "Passes of Python's cyclic garbage collector (nothing else runs meanwhile), by generation.",
            ["generation"],
            buckets=LAG_BUCKETS,
            registry=reg,
        )
        self.links_turned_away = Counter(
            "msgbus_links_turned_away",
            "Links other sites began to open that were told to dial again later (more came than "
            "--link-handshakes a second); those that waited their turn are not counted.",
            registry=reg,
        )
        self.refresh_ok = Gauge(
            "msgbus_refresh_ok",
            "1 if the gauges were refreshed at this scrape, 0 if they are stale.",
            registry=reg,
        )
        # Every label value is exported from the start (as 0), so rates and alerts see the series at once.
        # The children are kept: finding one through labels() costs more than counting (several per message).
        self._messages = {event: self.messages.labels(event=event) for event in MESSAGE_EVENTS}
        self._errors = {cause: self.errors.labels(cause=cause) for cause in ERROR_CAUSES}
        self._send_seconds = {path: self.send_seconds.labels(path=path) for path in SEND_PATHS}
        self._event_log_dropped = {
            reason: self.event_log_dropped.labels(reason=reason) for reason in EVENT_LOG_DROPS
        }
        self._collector_pauses = {
            generation: self.collector_pause_seconds.labels(generation=str(generation))
            for generation in range(3)
        }
        self._exposed: Collector = self.registry

    def message(self, event: MessageEvent, count: int = 1) -> None:
        """Count ``count`` messages that went through ``event``."""
        self._messages[_checked(event, MESSAGE_EVENTS)].inc(count)
        if event in _OUTGOING:
            self.recent.sent.add(count)
        elif event == "received":
            self.recent.received.add(count)

    def observe_loop_lag(self, seconds: float) -> None:
        self.loop_lag_seconds.observe(seconds)

    def observe_collector_pause(self, generation: int, seconds: float) -> None:
        pauses = self._collector_pauses.get(generation)
        if pauses is not None:
            pauses.observe(seconds)

    def link_turned_away(self) -> None:
        self.links_turned_away.inc()

    def error(self, cause: ErrorCause) -> None:
        """Count one failure of kind ``cause``."""
        self._errors[_checked(cause, ERROR_CAUSES)].inc()

    def event_log_drop(self, reason: EventLogDrop, count: int) -> None:
        """Count ``count`` events the event log dropped for ``reason``."""
        self._event_log_dropped[_checked(reason, EVENT_LOG_DROPS)].inc(count)

    def send_queue_read(self) -> None:
        self.send_queue_reads.inc()

    def observe_send(self, path: SendPath, seconds: float) -> None:
        """Record how long one POST to a peer took, whatever its outcome."""
        self._send_seconds[_checked(path, SEND_PATHS)].observe(seconds)

    def watch_twin_cache(self, stats: CacheStats) -> None:
        """Export the twin cache's counters (read at each scrape) as ``msgbus_twin_cache_total{what}``."""
        self.registry.register(_TwinCacheCollector(stats))

    def watch_mqtt_bridge(self, counters: object) -> None:
        """Export an MQTT bridge's counters (a dataclass of ints, read at each scrape) as
        ``msgbus_router_mqtt_total{what}``."""
        self.registry.register(_MqttCollector(counters))

    def observe_round_trip(self, seconds: float) -> None:
        """Record the time from accepting a local request to delivering its reply to the caller."""
        self.round_trip_seconds.observe(seconds)
        self.recent.round_trips.add(seconds)

    def set_queue_lengths(self, lengths: Mapping[str, int]) -> None:
        """Set ``msgbus_queue_length`` for each queue (a Redis key name) in ``lengths``."""
        for queue, length in lengths.items():
            self.queue_length.labels(queue=queue).set(length)

    def set_overdue(self, count: int) -> None:
        """Set the number of requests past their deadline that have no outcome yet."""
        self.overdue.set(count)

    def set_inflight(self, count: int) -> None:
        """Set the number of items being handled."""
        self.inflight.set(count)

    def set_links_open(self, count: int) -> None:
        self.links_open.set(count)

    def set_senders(self, running: int, waiting: int) -> None:
        """Set how many senders hold a place, and how many twins wait for one."""
        self.senders.set(running)
        self.senders_waiting.set(waiting)

    def set_peers_down(self, count: int) -> None:
        """Set the number of peers whose site does not answer."""
        self.peers_down.set(count)

    def set_site_instances(self, count: int) -> None:
        self.site_instances.set(count)

    def set_redis_evicting(self, evicting: bool) -> None:
        self.redis_evicting.set(int(evicting))

    def set_peer_clock_offset(self, twin: int, offset_s: float, peers_off: int) -> None:
        """Set how far ``twin``'s clock is ahead of this site's, and how many peers' clocks are off."""
        self.peer_clock_offset.labels(str(twin)).set(round(offset_s, 3))
        self.peers_clock_off.set(peers_off)

    def label_instance(self, instance: str) -> None:
        """Give every figure of this process (not those read from the site's Redis) an ``instance`` label:
        a site may run several processes."""
        self._exposed = _InstanceLabel(self.registry, instance)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition text and its content type; ``accept`` (an Accept header) may ask for OpenMetrics."""
        encode, content_type = choose_encoder(accept)
        return encode(self._exposed), content_type

    async def scrape(self, accept: str = "", refresh: Refresh | None = None) -> tuple[bytes, str]:
        """Await ``refresh``, then :meth:`render`. A failed or slow refresh leaves stale gauges."""
        if refresh is not None:
            try:
                async with asyncio.timeout(self.refresh_timeout_s):
                    await refresh()
                self.refresh_ok.set(1)
            except Exception as exc:
                log.warning("metrics refresh failed, the gauges are stale: %s", _describe(exc))
                self.refresh_ok.set(0)
        else:
            self.refresh_ok.set(1)
        return self.render(accept)


def metrics_endpoint(metrics: Metrics, refresh: Refresh | None = None) -> ASGIApp:
    """An ASGI app serving ``metrics``, for ``Route("/metrics", metrics_endpoint(m))``; ``refresh`` is
    awaited at each scrape to set the gauges."""
    return _MetricsApp(metrics, refresh)


# Figures every process of a site reads from the same Redis: the same for all, so not per process.
SITE_WIDE = frozenset(
    {"msgbus_queue_length", "msgbus_requests_overdue", "msgbus_site_instances", "msgbus_redis_evicting"}
)


class _InstanceLabel(Collector):
    """``registry``'s figures, each per-process one with an ``instance`` label."""

    def __init__(self, registry: CollectorRegistry, instance: str) -> None:
        self._registry = registry
        self._instance = instance

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.name not in SITE_WIDE:
                family.samples = [
                    sample._replace(labels={**sample.labels, "instance": self._instance})
                    for sample in family.samples
                ]
            yield family


class _TwinCacheCollector(Collector):
    def __init__(self, stats: CacheStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "msgbus_twin_cache",
            "Twin look-ups (lookups), answered from the cache (hits, negative_hits), asked of the chain or "
            "HTTP source (fetches), failed there (failures), answered with a stale answer (stale_served).",
            labels=["what"],
        )
        for what in TWIN_CACHE_COUNTS:
            family.add_metric([what], getattr(self._stats, what))
        yield family


class _MqttCollector(Collector):
    def __init__(self, counters: object) -> None:
        self._counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "msgbus_router_mqtt",
            "The edge router's MQTT messages: published (acknowledged by the broker), delivered (taken in), "
            "failed (not taken, sent again by the broker), rejected (over the size limit or a topic that is "
            "not UTF-8: dropped), redelivered (came again), connections (made).",
            labels=["what"],
        )
        for item in dataclasses.fields(self._counters):  # type: ignore[arg-type]  # a dataclass instance
            family.add_metric([item.name], getattr(self._counters, item.name))
        yield family


def healthz_endpoint(check: HealthCheck, *, timeout_s: float = REFRESH_TIMEOUT_S) -> ASGIApp:
    """An ASGI app telling whether the daemon is healthy, for ``Route("/healthz", healthz_endpoint(c))``.

    ``check`` returns details; a non-empty ``problems`` list among them means unhealthy. The answer is
    ``200 {"status": "ok", ...details}`` or ``503 {"status": "unhealthy", "problems": [...], ...details}``.
    A check that raises or takes longer than ``timeout_s`` is a problem too.
    """
    return _HealthzApp(check, timeout_s)


# Classes rather than functions: starlette's Route calls a plain function as request -> response, but mounts
# any other callable as an ASGI app.
class _MetricsApp:
    def __init__(self, metrics: Metrics, refresh: Refresh | None) -> None:
        self._metrics = metrics
        self._refresh = refresh

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        accept = Request(scope).headers.get("accept", "")
        body, content_type = await self._metrics.scrape(accept, self._refresh)
        await Response(body, 200, headers={"Content-Type": content_type})(scope, receive, send)


class _HealthzApp:
    def __init__(self, check: HealthCheck, timeout_s: float) -> None:
        self._check = check
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                details = dict(await self._check())
        except Exception as exc:
            details = {"problems": [f"health check failed: {_describe(exc)}"]}
        details.pop("status", None)
        problems = details.pop("problems", None) or []
        if not isinstance(problems, list):
            problems = [str(problems)]
        if problems:
            body: dict[str, object] = {"status": "unhealthy", "problems": problems, **details}
            status = 503
        else:
            body = {"status": "ok", **details}
            status = 200
        response = Response(
            json.dumps(body, default=str),
            status,
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )
        await response(scope, receive, send)


def _checked(value: _Label, allowed: tuple[_Label, ...]) -> _Label:
    # Label values outside the fixed sets would create unbounded series; the types catch most, this the rest.
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
