"""The caching front: positive and negative TTLs, stale-if-error, coalescing, counters.

The inner resolver is a real one over a dict that counts calls and fails on demand; time is an injected clock.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from twin_resolver import (
    AccountNotFound,
    CachedResolver,
    CacheStats,
    Resolver,
    ResolverError,
    ResolverUnavailable,
    StaticResolver,
    Twin,
    TwinNotFound,
    write_twin_file,
)
from twin_resolver.accounts import ss58_encode

KEY_1 = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
KEY_2 = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
TWIN_1 = Twin(id=1, address="127.0.0.1:18051", public_key=KEY_1, name="edge-1")
TWIN_2 = Twin(id=2, address="300:1::2", public_key=KEY_2)
DOWN = ResolverUnavailable("couldn't reach the chain at wss://chain.example: timed out")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingResolver:
    """A real resolver over a dict that counts calls, can fail on demand, and can hold answers back."""

    def __init__(self, twins: list[Twin]) -> None:
        self.twins = {twin.id: twin for twin in twins}
        self.calls = 0
        self.failures: list[ResolverError] = []
        self.down = False  # every call fails with DOWN while set
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.closed = False

    async def _enter(self) -> None:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        if self.down:
            raise DOWN

    async def get_twin(self, twin_id: int) -> Twin:
        await self._enter()
        if twin_id not in self.twins:
            raise TwinNotFound(twin_id)
        return self.twins[twin_id]

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        await self._enter()
        for twin in self.twins.values():
            if twin.public_key == public_key:
                return twin.id
        raise AccountNotFound(public_key)

    async def aclose(self) -> None:
        self.closed = True


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# --- positive answers ------------------------------------------------------------------------------------


async def test_answers_are_cached_for_the_ttl() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=300.0, clock=clock)
    assert await cache.get_twin(1) == TWIN_1
    clock.now += 299.0
    assert await cache.get_twin(1) == TWIN_1
    assert inner.calls == 1
    clock.now += 1.0
    assert await cache.get_twin(1) == TWIN_1
    assert inner.calls == 2


async def test_account_lookups_are_cached_separately() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=10.0, clock=clock)
    assert await cache.twin_id_by_public_key(KEY_1) == 1
    assert await cache.twin_id_by_public_key(KEY_1) == 1
    assert inner.calls == 1
    await cache.get_twin(1)
    assert inner.calls == 2
    clock.now += 10.0
    assert await cache.twin_id_by_public_key(KEY_1) == 1
    assert inner.calls == 3


async def test_a_changed_twin_is_seen_after_the_ttl() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=60.0, clock=clock)
    await cache.get_twin(1)
    moved = Twin(1, "300:1::9", KEY_1)
    inner.twins[1] = moved
    assert await cache.get_twin(1) == TWIN_1
    clock.now += 60.0
    assert await cache.get_twin(1) == moved


async def test_the_oldest_answers_make_room_beyond_max_entries() -> None:
    inner = CountingResolver([TWIN_1, TWIN_2, Twin(3, "", bytes(32))])
    cache = CachedResolver(inner, clock=Clock(), max_entries=2)
    for twin_id in (1, 2, 3):
        await cache.get_twin(twin_id)
    assert inner.calls == 3
    await cache.get_twin(3)
    await cache.get_twin(2)
    assert inner.calls == 3
    await cache.get_twin(1)
    assert inner.calls == 4


# --- not found: the negative TTL --------------------------------------------------------------------------


async def test_an_unknown_twin_is_asked_again_after_the_negative_ttl() -> None:
    inner, clock = CountingResolver([]), Clock()
    cache = CachedResolver(inner, clock=clock, negative_ttl_s=10.0)
    for _ in range(3):
        with pytest.raises(TwinNotFound) as caught:
            await cache.get_twin(2)
        assert str(caught.value) == "twin 2 not found"
    assert inner.calls == 1
    inner.twins[2] = TWIN_2
    clock.now += 9.9
    with pytest.raises(TwinNotFound):
        await cache.get_twin(2)
    clock.now += 0.1
    assert await cache.get_twin(2) == TWIN_2
    assert inner.calls == 2
    assert cache.stats.negative_hits == 3


async def test_an_unknown_account_is_remembered_too() -> None:
    inner, clock = CountingResolver([]), Clock()
    cache = CachedResolver(inner, clock=clock)
    for _ in range(2):
        with pytest.raises(AccountNotFound, match=f"no twin found for account {ss58_encode(KEY_2)}"):
            await cache.twin_id_by_public_key(KEY_2)
    assert inner.calls == 1
    clock.now += 10.0
    with pytest.raises(AccountNotFound):
        await cache.twin_id_by_public_key(KEY_2)
    assert inner.calls == 2


async def test_a_zero_negative_ttl_asks_every_time() -> None:
    inner = CountingResolver([])
    cache = CachedResolver(inner, clock=Clock(), negative_ttl_s=0.0)
    for _ in range(3):
        with pytest.raises(AccountNotFound):
            await cache.twin_id_by_public_key(KEY_2)
    assert inner.calls == 3


async def test_unavailability_is_not_cached() -> None:
    inner = CountingResolver([TWIN_1])
    inner.failures.append(ResolverUnavailable("chain unreachable"))
    cache = CachedResolver(inner, clock=Clock())
    with pytest.raises(ResolverUnavailable, match="chain unreachable"):
        await cache.get_twin(1)
    assert await cache.get_twin(1) == TWIN_1
    assert inner.calls == 2


async def test_a_deleted_twin_is_not_served_stale() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=60.0, clock=clock)
    await cache.get_twin(1)
    del inner.twins[1]
    clock.now += 60.0
    with pytest.raises(TwinNotFound):
        await cache.get_twin(1)
    clock.now += 10.0
    inner.down = True
    with pytest.raises(ResolverUnavailable):
        await cache.get_twin(1)  # "not found" was an answer: nothing is left to serve stale


# --- stale-if-error --------------------------------------------------------------------------------------


async def test_an_expired_answer_is_served_while_the_source_is_down(caplog: pytest.LogCaptureFixture) -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    stale: list[tuple[Any, ResolverUnavailable]] = []
    cache = CachedResolver(
        inner,
        ttl_s=300.0,
        clock=clock,
        stale_for_s=3600.0,
        stale_recheck_s=10.0,
        on_stale=lambda key, error: stale.append((key, error)),
    )
    await cache.get_twin(1)
    inner.down = True
    clock.now += 300.0
    with caplog.at_level(logging.WARNING, logger="twin_resolver.cache"):
        assert await cache.get_twin(1) == TWIN_1
        assert inner.calls == 2
        clock.now += 5.0
        assert await cache.get_twin(1) == TWIN_1  # within the recheck interval: the source is not asked
        assert inner.calls == 2
        clock.now += 5.0
        assert await cache.get_twin(1) == TWIN_1
        assert inner.calls == 3
    assert _warnings(caplog) == [
        "twin 1: serving the answer that expired 0 s ago while the twin source is unavailable "
        f"(for at most 3600 s more): {DOWN}"
    ]
    assert stale == [(1, DOWN)] * 3
    assert cache.stats == CacheStats(lookups=4, hits=0, fetches=3, failures=2, stale_served=3)


async def test_beyond_stale_for_the_error_propagates() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=300.0, clock=clock, stale_for_s=600.0, stale_recheck_s=10.0)
    await cache.get_twin(1)
    inner.down = True
    clock.now += 300.0 + 599.0
    assert await cache.get_twin(1) == TWIN_1
    clock.now += 1.0
    with pytest.raises(ResolverUnavailable) as caught:
        await cache.get_twin(1)
    assert caught.value is DOWN
    with pytest.raises(ResolverUnavailable):
        await cache.get_twin(1)  # the expired answer is gone, not served again on the next recheck
    assert cache.stats.stale_served == 1


async def test_each_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    inner, clock = CountingResolver([TWIN_1, TWIN_2]), Clock()
    cache = CachedResolver(inner, ttl_s=100.0, clock=clock, stale_recheck_s=0.0)
    await cache.get_twin(1)
    await cache.twin_id_by_public_key(KEY_2)
    inner.down = True
    clock.now += 100.0
    with caplog.at_level(logging.INFO, logger="twin_resolver.cache"):
        for _ in range(5):
            assert await cache.get_twin(1) == TWIN_1
            assert await cache.twin_id_by_public_key(KEY_2) == 2
        assert len(_warnings(caplog)) == 2
        assert _warnings(caplog)[1].startswith(f"account {ss58_encode(KEY_2)}: serving the answer")

        inner.down = False
        assert await cache.get_twin(1) == TWIN_1
        assert "twin 1: the twin source answers again" in caplog.messages
        inner.down = True
        clock.now += 100.0
        for _ in range(3):
            assert await cache.get_twin(1) == TWIN_1
    assert len(_warnings(caplog)) == 3  # the second outage of twin 1 is logged again, once
    assert cache.stats.stale_served == 13


async def test_a_fresh_answer_after_the_outage_is_cached_again() -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=100.0, clock=clock, stale_recheck_s=10.0)
    await cache.get_twin(1)
    inner.down = True
    clock.now += 100.0
    assert await cache.get_twin(1) == TWIN_1
    moved = Twin(1, "300:1::9", KEY_1)
    inner.twins[1], inner.down = moved, False
    clock.now += 10.0
    assert await cache.get_twin(1) == moved
    inner.down = True
    clock.now += 99.0
    assert await cache.get_twin(1) == moved
    assert inner.calls == 3


async def test_a_failing_stale_hook_does_not_fail_the_lookup(caplog: pytest.LogCaptureFixture) -> None:
    def broken_hook(key: int | bytes, error: ResolverUnavailable) -> None:
        raise RuntimeError("metrics registry gone")

    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=100.0, clock=clock, on_stale=broken_hook)
    await cache.get_twin(1)
    inner.down = True
    clock.now += 100.0
    with caplog.at_level(logging.ERROR, logger="twin_resolver.cache"):
        assert await cache.get_twin(1) == TWIN_1
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "twin 1: the on_stale hook failed"
    ]


async def test_stale_answers_are_shared_by_concurrent_lookups(caplog: pytest.LogCaptureFixture) -> None:
    inner, clock = CountingResolver([TWIN_1]), Clock()
    cache = CachedResolver(inner, ttl_s=100.0, clock=clock)
    await cache.get_twin(1)
    inner.down, inner.gate, inner.entered = True, asyncio.Event(), asyncio.Event()
    clock.now += 100.0
    with caplog.at_level(logging.WARNING, logger="twin_resolver.cache"):
        lookups = [asyncio.create_task(cache.get_twin(1)) for _ in range(4)]
        await _held(inner, lookups)
        assert await asyncio.gather(*lookups) == [TWIN_1] * 4
    assert inner.calls == 2
    assert len(_warnings(caplog)) == 1
    assert cache.stats.stale_served == 4


# --- coalescing ------------------------------------------------------------------------------------------


async def _held(inner: CountingResolver, lookups: list[asyncio.Task[Any]]) -> None:
    """Wait until the inner resolver is asked and every look-up is waiting, then let the answer through."""
    await inner.entered.wait()
    for _ in range(3):
        await asyncio.sleep(0)  # let the remaining look-ups reach the shared call
    assert not any(task.done() for task in lookups)
    assert inner.gate is not None
    inner.gate.set()


async def test_concurrent_lookups_share_one_call() -> None:
    inner = CountingResolver([TWIN_1])
    inner.gate = asyncio.Event()
    cache = CachedResolver(inner, clock=Clock())
    lookups = [asyncio.create_task(cache.get_twin(1)) for _ in range(5)]
    await _held(inner, lookups)
    assert await asyncio.gather(*lookups) == [TWIN_1] * 5
    assert inner.calls == 1
    assert await cache.get_twin(1) == TWIN_1
    assert inner.calls == 1
    assert cache.stats == CacheStats(lookups=6, hits=1, fetches=1)


async def test_concurrent_lookups_share_one_error() -> None:
    inner = CountingResolver([TWIN_1])
    inner.gate = asyncio.Event()
    inner.failures.append(ResolverUnavailable("chain unreachable"))
    cache = CachedResolver(inner, clock=Clock())
    lookups = [asyncio.create_task(cache.twin_id_by_public_key(KEY_1)) for _ in range(4)]
    await _held(inner, lookups)
    results = await asyncio.gather(*lookups, return_exceptions=True)
    assert [str(r) for r in results] == ["chain unreachable"] * 4
    assert all(isinstance(r, ResolverUnavailable) for r in results)
    assert inner.calls == 1
    assert await cache.twin_id_by_public_key(KEY_1) == 1
    assert inner.calls == 2


async def test_concurrent_lookups_share_one_not_found() -> None:
    inner = CountingResolver([])
    inner.gate = asyncio.Event()
    cache = CachedResolver(inner, clock=Clock())
    lookups = [asyncio.create_task(cache.get_twin(7)) for _ in range(3)]
    await _held(inner, lookups)
    results = await asyncio.gather(*lookups, return_exceptions=True)
    assert all(isinstance(r, TwinNotFound) for r in results)
    assert inner.calls == 1


async def test_different_keys_are_not_coalesced() -> None:
    inner = CountingResolver([TWIN_1, TWIN_2])
    inner.gate = asyncio.Event()
    cache = CachedResolver(inner, clock=Clock())
    lookups = [asyncio.create_task(cache.get_twin(i)) for i in (1, 2, 1)]
    await _held(inner, lookups)
    assert await asyncio.gather(*lookups) == [TWIN_1, TWIN_2, TWIN_1]
    assert inner.calls == 2


async def test_a_cancelled_waiter_does_not_cancel_the_others() -> None:
    inner = CountingResolver([TWIN_1])
    inner.gate = asyncio.Event()
    cache = CachedResolver(inner, clock=Clock())
    first = asyncio.create_task(cache.get_twin(1))
    second = asyncio.create_task(cache.get_twin(1))
    await inner.entered.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    inner.gate.set()
    assert await second == TWIN_1
    assert inner.calls == 1


async def test_aclose_closes_the_inner_resolver_and_abandons_lookups() -> None:
    inner = CountingResolver([TWIN_1])
    inner.gate = asyncio.Event()
    cache = CachedResolver(inner)
    waiting = asyncio.create_task(cache.get_twin(1))
    await inner.entered.wait()
    await cache.aclose()
    assert inner.closed
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_cache_over_a_static_resolver(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1, TWIN_2])
    cache: Resolver = CachedResolver(StaticResolver(path))
    assert await cache.get_twin(2) == TWIN_2
    assert await cache.twin_id_by_public_key(KEY_1) == 1
    await cache.aclose()
