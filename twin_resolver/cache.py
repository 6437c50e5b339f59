"""A caching front for a slow resolver (the chain).

- An answer is kept ``ttl_s``; "no such twin" / "no twin for this account" is kept ``negative_ttl_s``, so an
  unknown twin is asked again after a short while, not on every message.
- Concurrent look-ups of one key share one call to the inner resolver.
- Stale-if-error: when the inner resolver is unavailable and the last answer for a key expired less than
  ``stale_for_s`` ago, that answer is served instead of the error, and the inner resolver is asked again only
  every ``stale_recheck_s`` (so messages do not each wait for a timing-out chain). Each outage of a key is
  logged once; every stale answer is counted in :class:`CacheStats` and reported to ``on_stale``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from twin_resolver.base import AccountNotFound, Resolver, ResolverUnavailable, Twin, TwinNotFound

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

StaleHook = Callable[[int | bytes, ResolverUnavailable], None]
"""Called with the key (twin id or account) and the error each time a stale answer is served."""

_NOT_FOUND = (TwinNotFound, AccountNotFound)


@dataclass
class CacheStats:
    """Counters over the life of a :class:`CachedResolver` (both twin and account look-ups)."""

    lookups: int = 0
    """Look-ups asked of the cache."""
    hits: int = 0
    """Answered from a fresh cached answer."""
    negative_hits: int = 0
    """Answered "not found" from a cached not-found."""
    fetches: int = 0
    """Calls made to the inner resolver (concurrent look-ups of one key make one)."""
    failures: int = 0
    """Inner calls that ended in :class:`ResolverUnavailable`."""
    stale_served: int = 0
    """Look-ups answered with an expired answer because the inner resolver was unavailable."""


@dataclass(slots=True)
class _Answer(Generic[V]):
    value: V
    fresh_until: float
    stale_until: float
    # While serving stale, the inner resolver is not asked again before this time.
    recheck_at: float = 0.0
    error: ResolverUnavailable | None = None


@dataclass(frozen=True, slots=True)
class _Outcome(Generic[V]):
    value: V
    stale_because: ResolverUnavailable | None = None


@dataclass(frozen=True)
class CachePolicy:
    """How long answers are kept and served; every duration in seconds."""

    ttl_s: float = 300.0
    negative_ttl_s: float = 10.0
    stale_for_s: float = 3600.0
    stale_recheck_s: float = 10.0
    max_entries: int = 100_000


class _Cache(Generic[K, V]):
    """Answers and not-founds by key, with expiry, and the in-flight look-up per key."""

    def __init__(
        self,
        policy: CachePolicy,
        clock: Callable[[], float],
        stats: CacheStats,
        describe: Callable[[K], str],
        on_stale: Callable[[K, ResolverUnavailable], None] | None,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._stats = stats
        self._describe = describe
        self._on_stale = on_stale
        self._answers: dict[K, _Answer[V]] = {}
        self._not_found: dict[K, tuple[float, Exception]] = {}
        self._pending: dict[K, asyncio.Task[_Outcome[V]]] = {}
        self._stale_keys: set[K] = set()  # keys in an outage that was already logged

    async def get(self, key: K, fetch: Callable[[K], Coroutine[Any, Any, V]]) -> V:
        self._stats.lookups += 1
        now = self._clock()
        answer = self._answers.get(key)
        if answer is not None:
            if now < answer.fresh_until:
                self._stats.hits += 1
                return answer.value
            if now < answer.recheck_at and now < answer.stale_until and answer.error is not None:
                return self._serve_stale(key, answer.value, answer.error)
        missing = self._not_found.get(key)
        if missing is not None:
            expires, error = missing
            if now < expires:
                self._stats.negative_hits += 1
                raise error.with_traceback(None)
            del self._not_found[key]
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch(key, fetch))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        # Shielded: a waiter that is cancelled must not cancel the look-up the other waiters share.
        outcome = await asyncio.shield(task)
        if outcome.stale_because is not None:
            return self._serve_stale(key, outcome.value, outcome.stale_because)
        return outcome.value

    async def _fetch(self, key: K, fetch: Callable[[K], Coroutine[Any, Any, V]]) -> _Outcome[V]:
        self._stats.fetches += 1
        try:
            value = await fetch(key)
        except _NOT_FOUND as exc:
            self._forget(key)
            self._remember(self._not_found, key, (self._clock() + self._policy.negative_ttl_s, exc))
            raise
        except ResolverUnavailable as exc:
            self._stats.failures += 1
            return self._stale_or_raise(key, exc)
        now = self._clock()
        if key in self._stale_keys:
            self._stale_keys.discard(key)
            log.info("%s: the twin source answers again", self._describe(key))
        self._not_found.pop(key, None)
        fresh_until = now + self._policy.ttl_s
        stale_until = fresh_until + self._policy.stale_for_s
        self._remember(self._answers, key, _Answer(value, fresh_until, stale_until))
        return _Outcome(value)

    def _stale_or_raise(self, key: K, error: ResolverUnavailable) -> _Outcome[V]:
        now = self._clock()
        answer = self._answers.get(key)
        if answer is None or now >= answer.stale_until:
            self._forget(key)
            raise error
        answer.recheck_at = now + self._policy.stale_recheck_s
        answer.error = error
        if key not in self._stale_keys:
            self._stale_keys.add(key)
            log.warning(
                "%s: serving the answer that expired %.0f s ago while the twin source is unavailable "
                "(for at most %.0f s more): %s",
                self._describe(key),
                now - answer.fresh_until,
                answer.stale_until - now,
                error,
            )
        return _Outcome(answer.value, stale_because=error)

    def _serve_stale(self, key: K, value: V, error: ResolverUnavailable) -> V:
        self._stats.stale_served += 1
        if self._on_stale is not None:
            try:
                self._on_stale(key, error)
            except Exception:  # a broken metrics hook must not turn a good answer into an error
                log.exception("%s: the on_stale hook failed", self._describe(key))
        return value

    def _forget(self, key: K) -> None:
        self._answers.pop(key, None)
        self._stale_keys.discard(key)

    def _remember(self, table: dict[K, Any], key: K, entry: Any) -> None:
        table.pop(key, None)  # re-inserted last, so eviction order follows the latest answer
        if len(table) >= self._policy.max_entries:
            self._evict(table)
        table[key] = entry

    def _evict(self, table: dict[K, Any]) -> None:
        now = self._clock()
        for key in [key for key, entry in table.items() if _expired(entry, now)]:
            del table[key]
            self._stale_keys.discard(key)
        while len(table) >= self._policy.max_entries:
            oldest = next(iter(table))
            del table[oldest]
            self._stale_keys.discard(oldest)

    def _settle(self, key: K, task: asyncio.Task[_Outcome[V]]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]
        if not task.cancelled():
            task.exception()  # retrieved here, so an error nobody waited for is not reported as lost

    def cancel_pending(self) -> None:
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()


def _expired(entry: _Answer[Any] | tuple[float, Exception], now: float) -> bool:
    if isinstance(entry, _Answer):
        return entry.stale_until <= now
    return entry[0] <= now


class CachedResolver:
    """A :class:`~twin_resolver.base.Resolver` in front of another one (see the module docstring)."""

    def __init__(
        self,
        inner: Resolver,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
        *,
        negative_ttl_s: float = 10.0,
        stale_for_s: float = 3600.0,
        stale_recheck_s: float = 10.0,
        on_stale: StaleHook | None = None,
    ) -> None:
        """Cache ``inner``'s answers ``ttl_s`` (go-rmb keeps chain answers 5 minutes) and its not-founds
        ``negative_ttl_s``; serve an expired answer up to ``stale_for_s`` after its expiry while ``inner`` is
        unavailable, asking ``inner`` again every ``stale_recheck_s``. ``on_stale`` is called for each stale
        answer served (e.g. to count it in a metric)."""
        self.inner = inner
        self.stats = CacheStats()
        policy = CachePolicy(ttl_s, negative_ttl_s, stale_for_s, stale_recheck_s, max_entries)
        self._twins: _Cache[int, Twin] = _Cache(policy, clock, self.stats, _describe_twin, on_stale)
        self._ids: _Cache[bytes, int] = _Cache(policy, clock, self.stats, _describe_account, on_stale)

    async def get_twin(self, twin_id: int) -> Twin:
        """The twin with this id, from the cache or the inner resolver."""
        return await self._twins.get(twin_id, self.inner.get_twin)

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        """The twin id for this account, from the cache or the inner resolver."""
        return await self._ids.get(bytes(public_key), self.inner.twin_id_by_public_key)

    async def aclose(self) -> None:
        """Abandon look-ups in flight and close the inner resolver."""
        self._twins.cancel_pending()
        self._ids.cancel_pending()
        await self.inner.aclose()


def _describe_twin(twin_id: int) -> str:
    return f"twin {twin_id}"


def _describe_account(public_key: bytes) -> str:
    from twin_resolver.accounts import ss58_encode

    return f"account {ss58_encode(public_key) if len(public_key) == 32 else '0x' + public_key.hex()}"
