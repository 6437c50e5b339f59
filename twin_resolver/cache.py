"""A caching front for a slow resolver (the chain): answers kept ``ttl_s``, errors never kept, and
concurrent look-ups of the same key sharing one call to the inner resolver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from twin_resolver.base import Resolver, Twin

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Cache(Generic[K, V]):
    """Answers by key, with expiry, and the in-flight look-up per key."""

    def __init__(self, ttl_s: float, clock: Callable[[], float], max_entries: int) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._values: dict[K, tuple[float, V]] = {}
        self._pending: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, fetch: Callable[[K], Coroutine[Any, Any, V]]) -> V:
        hit = self._values.get(key)
        if hit is not None:
            expires, value = hit
            if self._clock() < expires:
                return value
            del self._values[key]
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(fetch(key))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        # Shielded: a waiter that is cancelled must not cancel the look-up the other waiters share.
        return await asyncio.shield(task)

    def _settle(self, key: K, task: asyncio.Task[V]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]
        if task.cancelled() or task.exception() is not None:
            return
        if len(self._values) >= self._max_entries:
            self._evict()
        self._values[key] = (self._clock() + self._ttl_s, task.result())

    def _evict(self) -> None:
        now = self._clock()
        for key in [key for key, (expires, _) in self._values.items() if expires <= now]:
            del self._values[key]
        while len(self._values) >= self._max_entries:
            del self._values[next(iter(self._values))]  # oldest insertion first

    def cancel_pending(self) -> None:
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()


class CachedResolver:
    """A :class:`~twin_resolver.base.Resolver` that caches another one's positive answers for ``ttl_s``."""

    def __init__(
        self,
        inner: Resolver,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        """Cache ``inner``'s answers (go-rmb keeps chain answers 5 minutes, and never keeps errors)."""
        self.inner = inner
        self._twins: _Cache[int, Twin] = _Cache(ttl_s, clock, max_entries)
        self._ids: _Cache[bytes, int] = _Cache(ttl_s, clock, max_entries)

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
