"""Whether the site's Redis may evict queued messages: its ``maxmemory-policy``, read at start and every
:data:`REFRESH_S` after; while it is not ``noeviction`` it is said in the log and among the site's warnings,
and the gauge ``msgbus_redis_evicting`` is 1.

An operator may change the policy at run time (``CONFIG SET``), so it is read again in a task of its own: one
``INFO memory`` round trip every :data:`REFRESH_S` keeps ``/status`` right whether or not Prometheus scrapes
(the metrics refresh runs only at a scrape). ``msgbus status`` reads the policy itself, so its own view is
never stale.

A Redis that fills up under ``noeviction`` while the daemon runs refuses writes, and every part of the daemon
keeps what it holds and tries again. One that is full at start refuses the daemon's first write: the daemon
says so and tries it again (0.1 s, doubling to 5 s) until Redis has room, then starts, rather than exiting
to be started again (and again) by its supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from msgbusd.reports.metrics import Metrics
from wire.backoff import REDIS_RECONNECT, sleep_unless
from wire.redis_memory import NO_EVICTION, evicting_policy_warning, maxmemory_policy

log = logging.getLogger("msgbusd.redis_memory")

# Seconds between two reads of the policy: a change made with CONFIG SET shows in /status within this.
REFRESH_S = 10.0
# A Redis full at start is said again this often while the daemon waits for room.
FULL_SAID_EVERY_S = 60.0


class RedisMemory:
    """The ``maxmemory-policy`` of the Redis at ``redis_url`` (redacted, for what is said), as last read."""

    def __init__(
        self,
        redis: aioredis.Redis,
        redis_url: str,
        *,
        metrics: Metrics | None = None,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._redis = redis
        self._url = redis_url
        self._metrics = metrics
        self._refresh_s = refresh_s
        # None until read: no warning for what cannot be told.
        self.policy: str | None = None
        self._unreadable_said = False

    async def start(self, first_write: Callable[[], Awaitable[object]], stopping: asyncio.Event) -> bool:
        """The check at start, and the daemon's ``first_write``: while Redis refuses it for want of memory,
        say so (again every :data:`FULL_SAID_EVERY_S`) and try again until it takes it. False if
        ``stopping`` came first."""
        await self.check()
        failures = 0
        said_at: float | None = None
        while not stopping.is_set():
            try:
                await first_write()
                if failures:
                    log.info("Redis at %s has room again: msgbusd starts", self._url)
                return True
            except OutOfMemoryError as exc:
                failures += 1
                now = time.monotonic()
                if said_at is None or now - said_at >= FULL_SAID_EVERY_S:
                    said_at = now
                    log.error(
                        "Redis at %s is full (%s): it refuses writes until memory is freed or maxmemory is "
                        "raised (CONFIG SET maxmemory); msgbusd starts once it has room",
                        self._url,
                        exc,
                    )
                await sleep_unless(stopping, REDIS_RECONNECT.delay_s(failures))
        return False

    async def check(self) -> None:
        """Read the policy again, and say in the log when it became one that evicts or went back to
        noeviction. A Redis that does not answer now leaves the last view as it is (the daemon's health
        check says Redis is away)."""
        try:
            policy = await self.read_policy()
        except (RedisError, OSError) as exc:
            log.debug("cannot read the maxmemory-policy of Redis at %s now: %s", self._url, exc)
            return
        if policy is None:
            if not self._unreadable_said:
                log.warning(
                    "cannot tell whether Redis at %s may evict queued messages: neither INFO memory nor "
                    "CONFIG GET names its maxmemory-policy; make sure it is %s",
                    self._url,
                    NO_EVICTION,
                )
                self._unreadable_said = True
            return
        if policy != self.policy:
            if policy != NO_EVICTION:
                log.warning("%s", evicting_policy_warning(self._url, policy))
            elif self.policy is not None:
                log.info("Redis at %s has maxmemory-policy %s now: it evicts nothing", self._url, policy)
        self.policy = policy
        if self._metrics is not None:
            self._metrics.set_redis_evicting(policy != NO_EVICTION)

    async def read_policy(self) -> str | None:
        """The policy as Redis says it: from ``INFO memory``, else ``CONFIG GET``; None when it answers
        neither (both disabled, renamed or not allowed)."""
        try:
            policy = maxmemory_policy(await self._redis.info("memory"))
        except ResponseError:
            policy = None
        if policy is not None:
            return policy
        try:
            answer = await self._redis.config_get("maxmemory-policy")
        except ResponseError:
            return None
        return maxmemory_policy({"maxmemory_policy": answer.get("maxmemory-policy")})

    def warnings(self) -> list[str]:
        """The site's warning while the policy read last is not noeviction (for ``SiteWarnings``)."""
        if self.policy is None or self.policy == NO_EVICTION:
            return []
        return [evicting_policy_warning(self._url, self.policy)]

    async def watch(self, stopping: asyncio.Event) -> None:
        """:meth:`check` every ``refresh_s`` until ``stopping``."""
        while not stopping.is_set():
            await sleep_unless(stopping, self._refresh_s)
            if not stopping.is_set():
                await self.check()
