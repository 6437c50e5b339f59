"""A few callers at a time in each turn of the event loop, the others in the next turns, in order."""

from __future__ import annotations

import asyncio

import pytest

from msgbusd.link.loop_turns import LoopTurns


async def test_callers_beyond_a_turns_room_go_on_in_the_next_turns_in_order() -> None:
    turns = LoopTurns(3)
    turn = 0
    went_on: list[tuple[int, int]] = []

    async def count_turns() -> None:
        nonlocal turn
        while True:
            await asyncio.sleep(0)
            turn += 1

    async def caller(n: int) -> None:
        await turns.take()
        went_on.append((n, turn))

    counting = asyncio.ensure_future(count_turns())
    try:
        await asyncio.gather(*(caller(n) for n in range(10)))
    finally:
        counting.cancel()
    assert [n for n, _ in went_on] == list(range(10))
    per_turn: dict[int, int] = {}
    for _, at in went_on:
        per_turn[at] = per_turn.get(at, 0) + 1
    assert max(per_turn.values()) <= 3 and len(per_turn) >= 4, per_turn


async def test_a_caller_alone_goes_on_at_once() -> None:
    turns = LoopTurns(1)
    await asyncio.wait_for(turns.take(), 1)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await asyncio.wait_for(turns.take(), 1)


def test_a_turn_has_room_for_one_at_least() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LoopTurns(0)
