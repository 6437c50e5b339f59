"""How the routers use the bus they run in: requests made inside the daemon, and their replies.

A router's request is accepted by the daemon exactly as a local client's would be (same script, same
backlog), through ``submit``, which returns its uid. Replies come back to an ordinary return list, taken
crash-safely: each item waits in the list's processing list until its handler acknowledged it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import redis.asyncio as aioredis

from router.protocol import UNLIMITED_TRIES
from wire import keys
from wire.envelope import PROTOCOL_VERSION, Envelope, EnvelopeDecodeError, encode_payload
from wire.reliable_list import ReliableList, consume_in_order

log = logging.getLogger(__name__)

Submit = Callable[[list[Envelope]], Awaitable[list[list[str] | None]]]
ReplyHandler = Callable[[list[tuple[bytes, Envelope]]], Awaitable[None]]
T = TypeVar("T")
R = TypeVar("R")

TAKE_BATCH = 256


def request(dst: int, cmd: str, payload: bytes, *, message_id: str, lifetime_s: float, ret: str) -> Envelope:
    """A router request to twin ``dst``: retried for as long as it lives, whatever its number of tries."""
    return Envelope(
        ver=PROTOCOL_VERSION,
        uid=message_id,
        cmd=cmd,
        exp=max(1, int(lifetime_s)),
        retries=UNLIMITED_TRIES,
        dat=encode_payload(payload),
        dst=(dst,),
        ret=ret,
        now=int(time.time()),
    )


class Coalescer(Generic[T, R]):
    """Calls ``fn`` (which takes a list and answers one result per item) for many concurrent callers at
    once: while a call is running, new items wait and go together in the next one."""

    def __init__(self, fn: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._fn = fn
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running = False

    async def one(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await self._fn([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running = False


class ReplyList:
    """Takes the replies that arrive on ``queue``, in batches, and hands each batch to ``handle``, which must
    acknowledge them (:meth:`ack`, or in its own scripts) or let them be taken again after a restart."""

    def __init__(self, redis: aioredis.Redis, queue: str, handle: ReplyHandler, block_s: float = 1.0) -> None:
        # The daemon LPUSHes replies onto a return list: the oldest is at the right.
        self._list = ReliableList(redis, queue, keys.processing(queue), oldest="RIGHT")
        self.queue = queue
        self._handle = handle
        self._block_s = block_s

    @property
    def processing(self) -> str:
        return self._list.processing

    async def ack(self, raws: list[bytes]) -> None:
        await self._list.ack(raws)

    async def run(self, stopping: asyncio.Event) -> None:
        await consume_in_order(self._list, self._one_batch, stopping, batch=TAKE_BATCH, block_s=self._block_s)

    async def _one_batch(self, raws: list[bytes]) -> None:
        replies = []
        undecodable = []
        for raw in raws:
            try:
                replies.append((raw, Envelope.decode(raw)))
            except EnvelopeDecodeError as exc:
                log.error("router: dropped an undecodable reply on %s: %s", self.queue, exc.reason)
                undecodable.append(raw)
        await self.ack(undecodable)
        if replies:
            await self._handle(replies)


class Waiters:
    """Callers waiting for the reply to one of their messages, by bus uid (in this process only).

    A reply may be taken before its caller started waiting (the caller is told its uid a moment after the
    message left): such replies are kept, the latest ``keep_early`` of them, for the caller to find.
    """

    def __init__(self, keep_early: int = 10_000) -> None:
        self._waiting: dict[str, asyncio.Future[Envelope]] = {}
        self._early: OrderedDict[str, Envelope] = OrderedDict()
        self._keep_early = keep_early

    def expect(self, uid: str) -> asyncio.Future[Envelope]:
        future: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        early = self._early.pop(uid, None)
        if early is not None:
            future.set_result(early)
        else:
            self._waiting[uid] = future
        return future

    def forget(self, uid: str) -> None:
        self._waiting.pop(uid, None)

    def resolve(self, uid: str, reply: Envelope, *, keep_if_early: bool = False) -> None:
        future = self._waiting.pop(uid, None)
        if future is not None:
            if not future.done():
                future.set_result(reply)
        elif keep_if_early:
            self._early[uid] = reply
            while len(self._early) > self._keep_early:
                self._early.popitem(last=False)
