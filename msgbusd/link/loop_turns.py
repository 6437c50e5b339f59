"""A few callers at a time in each turn of the event loop: for work that costs a fraction of a millisecond,
runs in one go, and can come by the hundred at once (a herd's handshakes, each checking two signatures and
making two), so that it is spread over several turns and everything else is not kept waiting behind it.

A semaphore would bound how many are under way, waiting on the network included (and so bound a herd's
pace by its round trip); this bounds only how many run in one turn.
"""

from __future__ import annotations

import asyncio
from collections import deque


class LoopTurns:
    """At most ``per_turn`` callers of :meth:`take` go on in one turn of the event loop; the others wait for
    the next turns, first come first served."""

    def __init__(self, per_turn: int) -> None:
        if per_turn < 1:
            raise ValueError("at least one caller a turn")
        self.per_turn = per_turn
        self._gone_on = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._next_turn: asyncio.Handle | None = None

    async def take(self) -> None:
        """Return in this turn if it has room (and nobody waits), else in a later one."""
        if self._gone_on < self.per_turn and not self._waiting:
            self._gone_on += 1
            self._schedule()
            return
        waiting = asyncio.get_running_loop().create_future()
        self._waiting.append(waiting)
        self._schedule()
        await waiting

    def _schedule(self) -> None:
        if self._next_turn is None:
            self._next_turn = asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self._next_turn = None
        self._gone_on = 0
        while self._waiting and self._gone_on < self.per_turn:
            waiting = self._waiting.popleft()
            if not waiting.done():
                waiting.set_result(None)
                self._gone_on += 1
        if self._waiting or self._gone_on:
            self._schedule()
