"""The batches a peer's sender has on their way at once, each awaiting its answers.

Over a link with a long round trip, or behind a large message on a thin one, a sender that waited for each
batch's answers before sending the next would leave the link idle most of the time. So up to :data:`WINDOW`
batches are on their way at once, each read after the ones before it (from memory, or ahead in the Redis
queue). Those with requests all go on one link: one that breaks fails the batches after it too, and all of
them come again from the queue, in order (what one peer's requests and replies carry is not ordered across
them). Each batch leaves the send queue only once the batches before it have: the queue is popped in order,
and a batch that did not all go, or a queue that held something else first, sends the rest from Redis again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from msgbusd.link.open_link import Link
from msgbusd.reports.logs import about
from msgbusd.sending.lanes import Lane
from msgbusd.sending.large_messages import LargeMessages
from msgbusd.sending.send_items import SendItem
from msgbusd.sending.senders import Senders

log = logging.getLogger("msgbusd.peers")

# Batches sent from memory whose answers are awaited at once, at most. The next batch goes when the ones
# before are answered, or once the last one sent has been on its way this long: over a link with a long
# round trip, or behind a large message on a thin one, a batch does not wait for the answer to the one
# before. On a quick link the answer comes first, and what was queued meanwhile goes in one batch; on a thin
# one, fewer and larger frames leave more of the cable to the large message (20 ms: worse tails there).
# A peer that asks to wait (503 or 429 with Retry-After) may have taken the batches sent after the refused
# one: they come again from Redis after the wait, and the peer drops what it already has.
WINDOW = 8
WINDOW_AFTER_S = 0.1

# How a peer sends a batch: (lane, the send queue's entries, their items, set once they are on a link, the
# link to send them on) -> how many leading entries are dealt with, and the keys of the replies the peer took.
Deliver = Callable[
    [Lane, list[str], list[SendItem], asyncio.Event | None, Link | None], Awaitable[tuple[int, list[str]]]
]


class BatchWindow:
    """One peer's batches on their way, oldest first, each awaiting its answers (True: all of it went, and is
    out of the queue)."""

    __slots__ = ("_batches", "_error", "_large", "_on", "_peers", "_sent_at", "_twin", "link")

    def __init__(self, twin: int, peers: Senders, large: LargeMessages) -> None:
        self._twin = twin
        self._peers = peers
        # The peer's large messages, sent beside the batches: each batch leaves the queue around them.
        self._large = large
        # The batches, when the last one was sent (monotonic), and the Redis error one of them met.
        self._batches: deque[asyncio.Task[bool]] = deque()
        self._sent_at = -math.inf
        self._error: RedisError | OSError | None = None
        # Each batch on its way: the link it went on (None: in POSTs), whether it carries requests, and the
        # send queue's entries it takes out.
        self._on: dict[asyncio.Task[bool], tuple[Link | None, bool, list[str]]] = {}
        # The link the batch being written went on (:mod:`msgbusd.sending.transmit` says which).
        self.link: Link | None = None

    @property
    def waited_for(self) -> bool:
        """Batches are on their way, or one of them met a Redis error not raised yet."""
        return bool(self._batches) or self._error is not None

    def entries_on_their_way(self) -> list[str]:
        """The send queue's entries the batches on their way take out, in order."""
        return [entry for batch in self._batches for entry in self._on[batch][2]]

    async def has_room(self) -> bool:
        """Whether another batch may leave now, beside the ones on their way; if not, wait until one of them
        is answered or the pace allows another (the step looks again after). A batch that did not all go
        ends the window (raising what it failed with)."""
        window = self._batches
        while window and window[0].done():
            self._on.pop(window[0], None)
            batch = window.popleft()
            if not _succeeded(batch):
                await self.drain()
                _raise_failure(batch)
                return False
        if self._error is not None:
            await self.drain()
            return False
        if window:
            wait_s = self._sent_at + WINDOW_AFTER_S - time.monotonic()
            if len(window) >= WINDOW or wait_s > 0:
                # What comes meanwhile goes in the same batch.
                timeout = None if len(window) >= WINDOW else wait_s
                await asyncio.wait(window, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                return False
        return True

    async def start(self, lane: Lane, items: list[SendItem], entries: list[str], deliver: Deliver) -> None:
        """Send ``items`` (the send queue's ``entries``, in order; an entry without an item is finished) in a
        batch of the window, with ``deliver`` (handed over for this batch only: the window keeps no reference
        to its peer); returns once it is written."""
        written = asyncio.Event()
        window = self._batches
        before = window[-1] if window else None
        has_requests = any(item.is_request for item in items)
        beside = self._link_beside(has_requests) if before is not None else None
        batch = asyncio.ensure_future(
            self._send_batch(lane, items, entries, before, beside, written, deliver)
        )
        batch.add_done_callback(lambda _: written.set())
        window.append(batch)
        self._on[batch] = (None, True, entries)
        self._sent_at = time.monotonic()
        # The next batch is written after this one.
        await written.wait()
        self._on[batch] = (self.link, has_requests, entries)

    def _link_beside(self, has_requests: bool) -> Link | None:
        """The link a batch can go on now, beside the batches on their way, if any: an open one, the
        same as the one each batch on its way with requests went on when it has requests (a
        broken link fails both, and both come again from the queue in order; what one peer's requests and
        replies carry is not ordered across them), and none once a batch before did not all go."""
        links = self._peers.links
        if links is None:
            return None
        link = links.current(self._twin, replies_only=not has_requests)
        if link is None:
            return None
        for batch in self._batches:
            if batch.done():
                if not _succeeded(batch):
                    return None
                continue
            on, with_requests, _ = self._on[batch]
            if on is None or not on.is_open or (has_requests and with_requests and on is not link):
                return None
        return link

    async def _send_batch(
        self,
        lane: Lane,
        items: list[SendItem],
        entries: list[str],
        before: asyncio.Task[bool] | None,
        beside: Link | None,
        written: asyncio.Event,
        deliver: Deliver,
    ) -> bool:
        """Send a batch; once the batches before it are out of the queue, take it (``entries``) out too.
        True when all of it went and the queue began with it; otherwise the lane sends from Redis again
        (the peer drops what it already has)."""
        try:
            if before is not None and beside is None and not await before:
                # Sent after the batches before are settled, and only if they all went: otherwise it would
                # arrive before what they leave in the queue.
                lane.distrust()
                return False
            if items:
                async with self._peers.turns:
                    done, replies = await deliver(lane, entries, items, written, beside)
            else:
                done, replies = len(entries), []
            written.set()
            if before is not None and not await before:
                lane.distrust()
                return False
            if done == len(entries):
                if await self._peers.store.sent(
                    self._twin, replies, exact=entries, ahead=self._large.entries
                ):
                    return True
                # The queue held more than memory, or in another order (several instances queue for one
                # destination; the word of one may be late): what was sent is out of it, the Redis path
                # sends the rest.
                lane.distrust()
                return False
            # Held messages: pop only what is certainly dealt with, and let the Redis path send the rest.
            lane.distrust()
            await self._peers.store.sent(self._twin, replies, exact=entries[:done], ahead=self._large.entries)
            return False
        except (RedisError, OSError) as exc:
            lane.distrust()
            self._error = self._error or exc
            return False
        finally:
            if not lane.trusted:
                lane.wake.set()

    async def drain(self) -> None:
        """Wait for the batches on their way; raises the Redis error one of them met."""
        window, self._batches = self._batches, deque()
        self._on.clear()
        if window:
            await asyncio.wait(window)
        error, self._error = self._error, None
        for batch in window:
            _raise_failure(batch)
        if error is not None:
            raise error

    async def end(self) -> None:
        """The sender ends: its batches on their way end first (with it, when it is cancelled)."""
        window, self._batches = self._batches, deque()
        self._on.clear()
        self._error = None
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            for batch in window:
                batch.cancel()
        elif window:
            await asyncio.wait(window)
            for batch in window:
                if not batch.cancelled() and (exc := batch.exception()) is not None:
                    log.error("sending to twin %s failed: %r", self._twin, exc, extra=about(dst=self._twin))


def _succeeded(batch: asyncio.Task[bool]) -> bool:
    """A batch sent beside the sender all went (and is out of the queue)."""
    return not batch.cancelled() and batch.exception() is None and batch.result()


def _raise_failure(batch: asyncio.Task[bool]) -> None:
    """Raise what a batch sent beside the sender failed with (it handles Redis and socket errors itself)."""
    if not batch.cancelled() and (exc := batch.exception()) is not None:
        raise exc
