"""Script calls of many tasks in one Redis round trip.

Each sender, and each reply that arrives, ends with a small script of its own. Run one by one, each pays a
whole round trip (a pooled connection, a write, a read, an event-loop wake-up); with thousands of peers
talked to at once, that is most of what a message costs. :class:`SharedRoundTrips` sends the calls made at
about the same time together: a call waits for the round trip on its way, if any, and goes with the next,
along with every call made meanwhile. Alone, a call goes at once (one loop turn later).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from msgbusd.store.replication import Replication
from msgbusd.store.script_batch import ScriptBatch

# Calls sent in one round trip at most (the rest go in the next).
MAX_CALLS = 512

ScriptCall = tuple[AsyncScript, Sequence[Any], Sequence[Any]]


@dataclass
class _Group:
    """One caller's calls, answered together (they stay next to each other in the round trip)."""

    calls: Sequence[ScriptCall]
    answer: asyncio.Future[list[Any]]


class SharedRoundTrips:
    def __init__(self, redis: aioredis.Redis, replication: Replication | None = None) -> None:
        self._redis = redis
        self._replication = replication
        self._waiting: list[_Group] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """The answers of ``calls``, in order, as :meth:`ScriptBatch.run` gives them (their first error
        other than NOSCRIPT is raised; other callers' errors are theirs)."""
        if not calls:
            return []
        answer: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Group(calls, answer))
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send_waiting())
        return await answer

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                groups = self._take_round()
                batch = ScriptBatch(self._redis, self._replication)
                for group in groups:
                    for script, keys, args in group.calls:
                        batch.script(script, keys, args)
                try:
                    answers = await batch.run_each()
                except BaseException as exc:
                    for group in groups:
                        _fail(group.answer, exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                start = 0
                for group in groups:
                    own = answers[start : start + len(group.calls)]
                    start += len(group.calls)
                    error = next((answer for answer in own if isinstance(answer, Exception)), None)
                    if error is not None:
                        _fail(group.answer, error)
                    elif not group.answer.done():
                        group.answer.set_result(own)
        finally:
            self._sender = None
            for group in self._waiting:
                _fail(group.answer, asyncio.CancelledError())
            self._waiting = []

    def _take_round(self) -> list[_Group]:
        """The waiting groups that fit in one round trip (at least one)."""
        taken, count = 0, 0
        for group in self._waiting:
            if taken and count + len(group.calls) > MAX_CALLS:
                break
            taken += 1
            count += len(group.calls)
        groups, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return groups


def _fail(answer: asyncio.Future[list[Any]], error: BaseException) -> None:
    if answer.done():
        return
    if isinstance(error, asyncio.CancelledError):
        answer.cancel()
    else:
        answer.set_exception(error)
