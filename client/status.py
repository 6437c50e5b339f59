"""What ``msgbus status`` finds out about a site: what its Redis holds, read directly (one round trip), and
what its daemon knows, from the daemon's loopback-only ``GET /status``.

Each side is read with a short timeout, and either may fail alone: a site whose daemon is down still shows
what waits in its Redis.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from client.cli_common import redact
from wire import keys
from wire.redis_memory import NO_EVICTION, maxmemory_policy
from wire.redis_url import as_text, sync_client
from wire.site_status import Traffic, optional_number

DEFAULT_SITE_URL = "http://127.0.0.1:8051"
DEFAULT_TIMEOUT_S = 2.0
# Dead letters whose reasons are shown, newest first.
NEWEST_DEAD_LETTERS = 3
# A request counts as overdue once it is this far past its deadline: the expiry timer answers each within a
# fraction of a second, so one that is still there after this long means the timer is not running.
OVERDUE_GRACE_S = 5.0

# The lengths of the send queues of every twin in the set of destinations, in the same round trip as the
# rest. Read-only.
_SEND_QUEUE_LENGTHS = """
local lengths = {}
for _, twin in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  lengths[#lengths + 1] = twin
  lengths[#lengths + 1] = redis.call('LLEN', ARGV[1] .. twin)
end
return lengths
"""

# Items the daemon's instances took from a system queue and have not finished handing off, counted over
# every instance's processing list. KEYS: instances. ARGV: the queue.
_PROCESSING_LENGTH = """
local total = redis.call('LLEN', ARGV[1] .. '.processing')
for _, instance in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  total = total + redis.call('LLEN', ARGV[1] .. '.processing.' .. instance)
end
return total
"""


# An instance that does not say its lease (--instance-lease) is taken to have msgbusd's default.
DEFAULT_LEASE_S = 5.0
# Every daemon instance of the site: Redis's time, then per instance its id, last beat and what it said of
# itself (field/value pairs). KEYS: instances. ARGV: the prefix of the instances' info keys.
_INSTANCES = """
local t = redis.call('TIME')
local found = {tostring(tonumber(t[1]) + tonumber(t[2]) / 1000000)}
local beats = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #beats, 2 do
  found[#found + 1] = {beats[i], beats[i + 1], redis.call('HGETALL', ARGV[1] .. beats[i])}
end
return found
"""


@dataclass(frozen=True)
class InstanceView:
    """One msgbusd process of the site, as it last said in Redis."""

    id: str
    alive: bool
    last_beat_s_ago: float
    leases: int
    sent_per_s: float
    received_per_s: float
    listen: str = ""


@dataclass(frozen=True)
class QueueDepth:
    """A system queue: items waiting, and items the daemon took and has not finished handing off."""

    name: str
    waiting: int
    processing: int


@dataclass(frozen=True)
class DeadLetter:
    at: float | None
    queue: str
    reason: str


@dataclass(frozen=True)
class RedisView:
    """What the site's Redis holds."""

    twin: int | None
    used_memory: int
    used_memory_human: str
    maxmemory: int
    maxmemory_human: str
    queues: tuple[QueueDepth, ...]
    backlog: int
    replies: int
    retries_scheduled: int
    overdue: int
    dead_letters: int
    newest_dead_letters: tuple[DeadLetter, ...]
    send_queues: dict[int, int]
    # The site's msgbusd processes, and which holds each site-wide job (a destination's sending by its
    # twin id, "local": taking local requests, "reply": taking the services' replies, "timers").
    instances: tuple[InstanceView, ...] = ()
    holders: dict[str, str] = field(default_factory=dict)
    # What Redis does when it is full: "noeviction" refuses writes, any other policy deletes keys (queued
    # messages among them); "" when it does not say.
    maxmemory_policy: str = ""

    @property
    def full(self) -> bool:
        """Redis has reached its maxmemory (under noeviction it refuses writes)."""
        return bool(self.maxmemory) and self.used_memory >= self.maxmemory

    @property
    def evicting(self) -> bool:
        """Redis may delete keys to make room."""
        return bool(self.maxmemory_policy) and self.maxmemory_policy != NO_EVICTION


@dataclass(frozen=True)
class PeerView:
    """A peer this site talks to. ``state`` is "unknown" when the daemon did not answer; ``queue`` is its
    send queue's length (None when Redis did not answer)."""

    twin: int
    state: str
    queue: int | None
    down_since: float | None = None
    cause: str = ""
    probes: int = 0
    next_probe_in_s: float | None = None
    last_sent_at: float | None = None
    last_error: str = ""
    last_error_at: float | None = None
    # The msgbusd process of the site that sends to it ("" when none holds it).
    sender: str = ""


@dataclass(frozen=True)
class UplinkView:
    """A link kept open by an edge so that the other site can reach it: ``direction`` "out" for the ones
    this site keeps (``--uplink``), "relay" for its link to the relay its twin entry names (``relay``; the
    relay's ``twin`` once it answered), "in" for those twins opened to it (at a relay: the twins it relays);
    ``since``: when it last opened or closed (None: not tried yet)."""

    twin: int | None
    direction: str
    open: bool
    since: float | None = None
    relay: str = ""


@dataclass(frozen=True)
class DaemonView:
    """What the daemon reported."""

    twin: int
    version: str
    started_at: float
    uptime_s: float
    problems: tuple[str, ...]
    inflight: int
    links_open: int
    peers: tuple[PeerView, ...]
    traffic: Traffic
    uplinks: tuple[UplinkView, ...] = ()
    # What the operator should act on though the bus works (a log it cannot write, a clock off, ...).
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SiteStatus:
    """Both sides of a site at ``checked_at`` (unix time); a side that did not answer has its error."""

    checked_at: float
    redis_url: str
    site_url: str
    redis: RedisView | None = None
    redis_error: str = ""
    daemon: DaemonView | None = None
    daemon_error: str = ""
    # The daemon answered, though not with its report (e.g. 403: --site is not a loopback address).
    daemon_answered: bool = False
    peers: tuple[PeerView, ...] = field(default=())


def gather(redis_url: str, site_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> SiteStatus:
    """Read the site's Redis and ask its daemon; never raises for a side that does not answer."""
    now = time.time()
    redis_view, redis_error = None, ""
    try:
        redis_view = read_redis(redis_url, now, timeout_s)
    except (RedisError, OSError) as exc:
        redis_error = str(exc) or type(exc).__name__
    daemon, daemon_error, daemon_answered = None, "", False
    try:
        daemon = read_daemon(site_url, timeout_s)
    except DaemonUnavailable as exc:
        daemon_error, daemon_answered = str(exc), exc.answered
    return SiteStatus(
        checked_at=now,
        redis_url=redact(redis_url),
        site_url=site_url,
        redis=redis_view,
        redis_error=redis_error,
        daemon=daemon,
        daemon_error=daemon_error,
        daemon_answered=daemon_answered,
        peers=merge_peers(daemon, redis_view),
    )


def open_redis(redis_url: str, timeout_s: float) -> Redis:
    """A client that fails within ``timeout_s`` and does not retry: a Redis that is away is reported, not
    waited for. Raises ValueError for an unusable URL."""
    return sync_client(
        redis_url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def read_redis(redis_url: str, now: float, timeout_s: float = DEFAULT_TIMEOUT_S) -> RedisView:
    """Everything ``msgbus status`` shows from Redis, in one round trip."""
    with open_redis(redis_url, timeout_s) as redis, redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.SITE_TWIN)
        pipe.info("memory")
        for queue in keys.SYSTEM_QUEUES:
            pipe.llen(queue)
            pipe.eval(_PROCESSING_LENGTH, 1, keys.INSTANCES, queue)
        pipe.hlen(keys.BACKLOG)
        pipe.hlen(keys.REPLIES)
        pipe.zcard(keys.OUTBOX)
        pipe.zcount(keys.DEADLINES, "-inf", now - OVERDUE_GRACE_S)
        pipe.llen(keys.DEAD_LETTER)
        pipe.lrange(keys.DEAD_LETTER, 0, NEWEST_DEAD_LETTERS - 1)
        pipe.eval(_SEND_QUEUE_LENGTHS, 1, keys.DESTINATIONS, keys.SEND_QUEUE_PREFIX)
        pipe.eval(_INSTANCES, 1, keys.INSTANCES, keys.instance_info(""))
        pipe.hgetall(keys.OWNERS)
        answers = pipe.execute()
    twin, memory, *rest = answers
    depths, rest = rest[: 2 * len(keys.SYSTEM_QUEUES)], rest[2 * len(keys.SYSTEM_QUEUES) :]
    backlog, replies, outbox, overdue, dead_letters, newest, lengths, instances, holders = rest
    return RedisView(
        twin=int(twin) if twin is not None and twin.isdigit() else None,
        used_memory=int(memory.get("used_memory", 0)),
        used_memory_human=str(memory.get("used_memory_human", "")),
        maxmemory=int(memory.get("maxmemory", 0)),
        maxmemory_human=str(memory.get("maxmemory_human", "")),
        maxmemory_policy=maxmemory_policy(memory) or "",
        queues=tuple(
            QueueDepth(queue, int(depths[2 * index]), int(depths[2 * index + 1]))
            for index, queue in enumerate(keys.SYSTEM_QUEUES)
        ),
        backlog=int(backlog),
        replies=int(replies),
        retries_scheduled=int(outbox),
        overdue=int(overdue),
        dead_letters=int(dead_letters),
        newest_dead_letters=tuple(_dead_letter(raw) for raw in newest),
        send_queues={
            int(twin): int(length) for twin, length in zip(lengths[::2], lengths[1::2], strict=True)
        },
        instances=_instances(instances),
        holders={as_text(name): as_text(holder) for name, holder in holders.items()},
    )


def _instances(found: list[Any]) -> tuple[InstanceView, ...]:
    now, *entries = found
    views = []
    for instance, beat, flat in entries:
        info = {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}
        age = float(now) - float(beat)
        lease_s = _number(info.get("lease"), DEFAULT_LEASE_S)
        views.append(
            InstanceView(
                id=as_text(instance),
                alive=age <= lease_s,
                last_beat_s_ago=round(age, 3),
                leases=int(_number(info.get("owned"), 0)),
                sent_per_s=_number(info.get("sent_per_s"), 0.0),
                received_per_s=_number(info.get("received_per_s"), 0.0),
                listen=info.get("listen", ""),
            )
        )
    return tuple(sorted(views, key=lambda view: view.id))


def _number(text: str | None, default: float) -> float:
    try:
        return float(text) if text is not None else default
    except ValueError:
        return default


def _dead_letter(raw: bytes) -> DeadLetter:
    try:
        item = json.loads(raw)
        at = item.get("at")
        return DeadLetter(
            at=round(float(at), 3) if isinstance(at, int | float) else None,
            queue=str(item.get("queue", "")),
            reason=str(item.get("reason", "")),
        )
    except (ValueError, AttributeError):
        return DeadLetter(None, "", f"an unreadable dead letter: {raw[:80]!r}")


class DaemonUnavailable(Exception):
    """The daemon did not answer ``/status`` (``answered`` False), or answered something else than its
    report."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


def read_daemon(site_url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DaemonView:
    """The daemon's ``/status`` report; raises :class:`DaemonUnavailable`."""
    url = site_url.rstrip("/") + "/status"
    # The daemon is on this machine: never through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise DaemonUnavailable(
            f"{url} answered {exc.code}: {_error_text(exc.read())}", answered=True
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise DaemonUnavailable(f"{url}: {reason}", answered=False) from exc
    except ValueError as exc:
        raise DaemonUnavailable(f"unusable site URL {site_url!r}: {exc}", answered=False) from exc
    try:
        return parse_report(json.loads(body))
    except (ValueError, TypeError, KeyError) as exc:
        raise DaemonUnavailable(f"{url} answered no status report ({exc})", answered=True) from exc


def _error_text(body: bytes) -> str:
    try:
        answer = json.loads(body)
        return str(answer.get("Message") or "; ".join(answer["problems"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return body[:200].decode("utf-8", "replace")


def parse_report(report: dict[str, Any]) -> DaemonView:
    """The daemon's ``/status`` JSON as a :class:`DaemonView`; raises ValueError, TypeError or KeyError."""
    traffic = report["traffic"]
    return DaemonView(
        twin=int(report["twin"]),
        version=str(report["version"]),
        started_at=float(report["started_at"]),
        uptime_s=float(report["uptime_s"]),
        problems=tuple(str(problem) for problem in report["problems"]),
        warnings=tuple(str(warning) for warning in report.get("warnings", [])),
        inflight=int(report["inflight"]),
        links_open=int(report["links_open"]),
        peers=tuple(
            PeerView(
                twin=int(peer["twin"]),
                state=str(peer["state"]),
                queue=None,
                down_since=optional_number(peer.get("down_since")),
                cause=str(peer.get("cause", "")),
                probes=int(peer.get("probes", 0)),
                next_probe_in_s=optional_number(peer.get("next_probe_in_s")),
                last_sent_at=optional_number(peer.get("last_sent_at")),
                last_error=str(peer.get("last_error", "")),
                last_error_at=optional_number(peer.get("last_error_at")),
            )
            for peer in report["peers"]
        ),
        traffic=Traffic.from_json(traffic),
        uplinks=tuple(
            UplinkView(
                twin=None if uplink.get("twin") is None else int(uplink["twin"]),
                direction=str(uplink["direction"]),
                open=bool(uplink["open"]),
                since=optional_number(uplink.get("since")),
                relay=str(uplink.get("relay") or ""),
            )
            for uplink in report.get("uplinks", [])
        ),
    )


def merge_peers(daemon: DaemonView | None, redis: RedisView | None) -> tuple[PeerView, ...]:
    """The peers the daemon reports and those with messages waiting in Redis, each with its queue length."""
    known = {peer.twin: peer for peer in daemon.peers} if daemon is not None else {}
    queued = redis.send_queues if redis is not None else {}
    merged = []
    for twin in sorted(known.keys() | queued.keys()):
        queue = queued.get(twin, 0) if redis is not None else None
        peer = known.get(twin)
        sender = redis.holders.get(str(twin), "") if redis is not None else ""
        merged.append(
            replace(peer, queue=queue, sender=sender)
            if peer
            else PeerView(twin, "unknown", queue, sender=sender)
        )
    return tuple(merged)
