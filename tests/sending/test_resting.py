"""Peers whose sender stopped rest a while, and are forgotten in the order they came to rest once they have
rested long enough, unless they woke meanwhile."""

from __future__ import annotations

import asyncio

from msgbusd.sending.resting import RestingPeers

KEPT_S = 0.25


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def next_forgotten(forgotten: asyncio.Queue[int]) -> int:
    async with asyncio.timeout(5):
        return await forgotten.get()


async def test_a_peer_is_forgotten_once_it_rested_long_enough_and_one_that_woke_is_not() -> None:
    forgotten: asyncio.Queue[int] = asyncio.Queue()
    clock = Clock()
    resting = RestingPeers(forgotten.put_nowait, kept_s=KEPT_S, clock=clock)
    resting.rest(7)
    clock.now += 0.125
    resting.rest(8)
    resting.rest(9)
    resting.woke(9)  # it has a sender again
    assert 7 in resting and 9 not in resting and len(resting) == 2
    clock.now += KEPT_S - 0.125
    assert await next_forgotten(forgotten) == 7
    assert 8 in resting, "8 came to rest later"
    clock.now += 0.125
    assert await next_forgotten(forgotten) == 8
    assert len(resting) == 0 and forgotten.empty()


async def test_a_peer_that_rests_again_rests_from_then_on() -> None:
    forgotten: asyncio.Queue[int] = asyncio.Queue()
    clock = Clock()
    resting = RestingPeers(forgotten.put_nowait, kept_s=KEPT_S, clock=clock)
    resting.rest(7)
    resting.rest(8)
    clock.now += KEPT_S / 2
    resting.rest(7)  # sent to again, and its sender stopped again
    clock.now += KEPT_S / 2
    assert await next_forgotten(forgotten) == 8
    assert 7 in resting
    clock.now += KEPT_S / 2
    assert await next_forgotten(forgotten) == 7
