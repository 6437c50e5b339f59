"""Redis clients from the URLs every msgbus program takes: redis-py's own (``redis://``, ``rediss://``,
``unix://``), and ``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]``, whose master is
found through Redis Sentinel and followed across a failover (redis-py's Sentinel support: a connection that
finds the old master gone, or demoted to a replica, asks the sentinels again).

The password, if any, is the master's; the sentinels are asked without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import Sentinel, SentinelConnectionPool
from redis.utils import HIREDIS_AVAILABLE

from wire.redis_pool import QuickBlockingPool, QuickWaits

try:
    from redis.connection import HiredisRespSerializer
except ImportError:  # an older redis-py: its asyncio connections pack in Python
    HiredisRespSerializer = None  # type: ignore[assignment,misc]

try:
    from redis.driver_info import DriverInfo
except ImportError:  # an older redis-py, which reads its own version once, when imported
    DriverInfo = None  # type: ignore[assignment,misc]

# redis-py's Sentinel classes are untyped.
_SENTINELS: dict[bool, Any] = {False: Sentinel, True: AsyncSentinel}

# What each new connection tells Redis of its client (CLIENT SETINFO), given once: redis-py 8 otherwise looks
# its own version up in the installed packages' metadata for every connection it opens (0.4 ms of CPU each,
# about half of what a new connection costs: a pool filling up at start, or again after Redis restarted).
_CONNECTION_DEFAULTS: dict[str, Any] = (
    {"driver_info": DriverInfo(name="redis-py", lib_version=redis.__version__)}
    if DriverInfo is not None
    else {}
)

SENTINEL_SCHEME = "redis+sentinel://"


class RedisUrlError(ValueError):
    pass


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelUrl | None:
    """The parts of a ``redis+sentinel://`` URL; None for any other URL."""
    if not url.startswith(SENTINEL_SCHEME):
        return None
    rest = url.removeprefix(SENTINEL_SCHEME)
    userinfo, at, rest = rest.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) if at and ":" in userinfo else None
    hosts, _, path = rest.partition("/")
    master, _, db_text = path.partition("/")
    if not master:
        raise RedisUrlError(
            f"{url!r}: name the master: redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME"
        )
    if db_text and not db_text.isdigit():
        raise RedisUrlError(f"{url!r}: the database after the master name is a number")
    sentinels = []
    for host_port in hosts.split(","):
        host, sep, port = host_port.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RedisUrlError(f"{url!r}: each sentinel is HOST:PORT, not {host_port!r}")
        sentinels.append((host.strip("[]"), int(port)))
    return SentinelUrl(tuple(sentinels), unquote(master), int(db_text or 0), password or None)


def as_text(value: object) -> str:
    """A value Redis answered with (bytes, unless the client decodes), as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def redacted(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, credentials = head.partition("://")
    user, colon, _password = credentials.partition(":")
    return f"{scheme}://{user}:***@{tail}" if colon else url


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A client of the Redis at ``url``; ``options`` are redis-py's connection options."""
    options = {**_CONNECTION_DEFAULTS, **options}
    found = parse_sentinel_url(url)
    if found is None:
        return redis.Redis.from_url(url, **options)
    sentinel = _SENTINELS[False](list(found.sentinels), sentinel_kwargs=_sentinel_options(options), **options)
    client: redis.Redis = sentinel.master_for(
        found.master, connection_pool_class=_SentinelPool, db=found.db, password=found.password
    )
    return client


class _SentinelPool(SentinelConnectionPool):
    """The master's connections; closing them closes the connections to the sentinels too."""

    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        for sentinel in self.sentinel_manager.sentinels:
            sentinel.connection_pool.disconnect()


class _AsyncSentinelPool(AsyncSentinelPool):
    """:class:`_SentinelPool` for asyncio."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        for sentinel in self.sentinel_manager.sentinels:
            await sentinel.connection_pool.disconnect()


class _BlockingSentinelPool(QuickWaits, _AsyncSentinelPool, BlockingConnectionPool):
    """The master's connections through the sentinels, with a command waiting for a free connection
    instead of failing when all are in use."""


def async_client(
    url: str, *, max_connections: int | None = None, wait_s: float | None = None, **options: Any
) -> aioredis.Redis:
    """An asyncio client of the Redis at ``url``. With ``max_connections``, a command waits up to ``wait_s``
    (None: as long as it takes) for a free connection; ``options`` are redis-py's connection options."""
    client = _async_client(url, max_connections=max_connections, wait_s=wait_s, **options)
    text_codec = (options.get("encoding", "utf-8"), options.get("encoding_errors", "strict"))
    if text_codec == ("utf-8", "strict"):
        pool = client.connection_pool
        pool.connection_class = _packed_by_hiredis(pool.connection_class)
    return client


class _HiredisPacking:
    """Commands packed by hiredis, in C, as redis-py's synchronous connections do; its asyncio connections
    pack them in Python (17 us for a script call with a 232-byte envelope, against 4.6)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = _HIREDIS_PACKER.pack(*args)
        return packed


_HIREDIS_PACKER: Any = HiredisRespSerializer() if HiredisRespSerializer is not None else None
_PACKED_BY_HIREDIS: dict[type, type] = {}


def _packed_by_hiredis(connection_class: type) -> type:
    """``connection_class`` packing its commands with hiredis where it is installed (the daemon's extra),
    for connections that encode text as strict UTF-8 (as hiredis does)."""
    if not HIREDIS_AVAILABLE or HiredisRespSerializer is None:
        return connection_class
    if connection_class not in _PACKED_BY_HIREDIS:
        variant = type(connection_class.__name__, (_HiredisPacking, connection_class), {})
        _PACKED_BY_HIREDIS[connection_class] = variant
    return _PACKED_BY_HIREDIS[connection_class]


def _async_client(
    url: str, *, max_connections: int | None, wait_s: float | None, **options: Any
) -> aioredis.Redis:
    options = {**_CONNECTION_DEFAULTS, **options}
    found = parse_sentinel_url(url)
    if found is None:
        if max_connections is None:
            return aioredis.Redis.from_url(url, **options)
        pool = QuickBlockingPool.from_url(url, max_connections=max_connections, timeout=wait_s, **options)
        return aioredis.Redis.from_pool(pool)
    sentinel = _SENTINELS[True](list(found.sentinels), sentinel_kwargs=_sentinel_options(options), **options)
    limits: dict[str, Any] = {"connection_pool_class": _AsyncSentinelPool}
    if max_connections is not None:
        limits = {"connection_pool_class": _BlockingSentinelPool, "max_connections": max_connections}
        limits["timeout"] = wait_s
    client: aioredis.Redis = sentinel.master_for(found.master, db=found.db, password=found.password, **limits)
    return client


def _sentinel_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that apply to the connections to the sentinels themselves."""
    wanted = (
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "driver_info",
    )
    return {name: options[name] for name in wanted if name in options}
