"""How the routers use the bus they run in: requests made inside the daemon, and their replies.

A router's request is accepted by the daemon exactly as a local client's would be (same script, same
backlog), through ``submit``, which returns its uid. Replies come back to an ordinary return list, taken
crash-safely: each item waits in the list's processing list until its handler acknowledged it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from msgbusd import keys
from msgbusd.backoff import Backoff
from msgbusd.envelope import PROTOCOL_VERSION, Envelope, EnvelopeDecodeError, encode_payload
from msgbusd.queues import Store
from msgbusd.router.protocol import UNLIMITED_TRIES

log = logging.getLogger(__name__)

Submit = Callable[[list[Envelope]], Awaitable[list[list[str] | None]]]
ReplyHandler = Callable[[bytes, Envelope], Awaitable[None]]

TAKE_BATCH = 256
REDIS_RETRY = Backoff(base_s=0.1, max_s=5.0)


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


class ReplyList:
    """Takes the replies that arrive on ``queue`` and hands each to ``handle``, which must call
    :meth:`ack` (or let the item be taken again after a restart)."""

    def __init__(self, store: Store, queue: str, handle: ReplyHandler, block_s: float = 1.0) -> None:
        self._store = store
        self.queue = queue
        self._handle = handle
        self._block_s = block_s

    @property
    def processing(self) -> str:
        return keys.processing(self.queue)

    async def ack(self, raw: bytes) -> None:
        await self._store.redis.lrem(self.processing, 1, raw)  # type: ignore[arg-type]  # bytes are fine

    async def run(self, stopping: asyncio.Event) -> None:
        failures = 0
        while not stopping.is_set():
            try:
                if failures == 0:
                    await self._store.recover(self.queue)
                raws = await self._store.take(self.queue, TAKE_BATCH, self._block_s)
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                log.warning("router: taking replies from %s failed (%s); trying again", self.queue, exc)
                await _sleep_unless(stopping, REDIS_RETRY.delay_s(failures))
                continue
            for raw in raws:
                await self._one(raw)

    async def _one(self, raw: bytes) -> None:
        try:
            env = Envelope.decode(raw)
        except EnvelopeDecodeError as exc:
            log.error("router: dropped an undecodable reply on %s: %s", self.queue, exc.reason)
            await self.ack(raw)
            return
        try:
            await self._handle(raw, env)
        except Exception:
            # The item stays in the processing list: it is handled again at the next start.
            log.exception("router: handling a reply on %s failed (uid %s)", self.queue, env.uid)


class Waiters:
    """Callers waiting for the reply to one of their messages, by message id (in this process only)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[Envelope]] = {}

    def expect(self, message_id: str) -> asyncio.Future[Envelope]:
        future: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = future
        return future

    def forget(self, message_id: str) -> None:
        self._waiting.pop(message_id, None)

    def resolve(self, message_id: str, reply: Envelope) -> bool:
        future = self._waiting.pop(message_id, None)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True


async def _sleep_unless(stopping: asyncio.Event, delay_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), delay_s)
