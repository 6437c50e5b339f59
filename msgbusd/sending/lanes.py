"""What a destination's sender knows of its send queue in Redis, and what is kept for one whose sender has
not started.

The send queue in Redis is the truth; memory only saves reading it. While a sender knows that what memory
holds mirrors the queue (:class:`Lane`, trusted), it sends what was just queued straight from memory and only
takes what it sent out of the queue. Anything unexpected (another instance of the site queued for the same
destination, a Redis error, messages held back while the peer is down or asks to wait) makes it read the queue
again until it has sent all of it with nothing unknown queued meanwhile. What memory keeps is bounded
(:data:`KEPT_WHILE_UNTRUSTED`): a sender too far behind reads the queue to its end instead, and so does one
that starts for a destination whose work was not all kept while it waited (:class:`Kept`).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from msgbusd.sending.send_items import SendItem

# Entries sent at once at most.
BATCH = 64
# What a sender that is not in step with its queue keeps of the work queued meanwhile, to catch up; and what
# is kept for a destination whose sender has not started yet.
KEPT_WHILE_UNTRUSTED = 4 * BATCH


@dataclass(eq=False)
class Lane:
    """A running sender's view of its queue.

    ``fresh`` holds what was just queued for the destination, ready to send, while ``trusted`` says it
    mirrors the Redis send queue; then the sender sends from memory and only takes what it sent out of the
    queue (checking the queue started with it). Anything unexpected makes the lane untrusted: it sends from
    Redis again until it has sent the whole queue with nothing unknown queued meanwhile; what was queued
    since (kept in ``fresh``) is then all that is left, and the lane is trusted again.
    """

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    fresh: deque[SendItem] = field(default_factory=deque)
    trusted: bool = False
    # Something not known was queued while untrusted: reading Redis to its end does not prove the lane is
    # in step.
    missed: bool = False
    # Work this instance was not told of may wait in the queue (behind what memory holds): the queue is read
    # once memory is sent.
    recheck: bool = False
    # While the peer is down: how many entries at the head of the queue have their give-up time written.
    noted: int = 0
    # The peer asked us to wait (503 with Retry-After) until this time (monotonic).
    paused_until: float = 0.0
    # While the peer is down: when the first waiting message gives up (None: not read yet), and when the
    # finished entries at the head of the queue were last dropped.
    give_up_at: float | None = None
    trimmed_at: float = -math.inf
    # Idle, and asked to stop: another twin waits for the sender's place.
    give_way: bool = False
    # The entries of the last batch sent from Redis: the word that one of them was queued may come after.
    sent_from_queue: set[str] = field(default_factory=set)

    def distrust(self) -> None:
        self.trusted = False
        self.fresh.clear()

    def queued(self, items: Sequence[SendItem]) -> None:
        """``items`` were just queued: sent from memory unless the Redis path already sent them."""
        self.fresh.extend(item for item in items if item.entry not in self.sent_from_queue)
        if not self.trusted and len(self.fresh) > KEPT_WHILE_UNTRUSTED:
            # Too far behind to catch up from memory: Redis is read until it is empty.
            self.fresh.clear()
            self.missed = True

    def sent_from_redis(self, entries: Sequence[str]) -> None:
        """``entries`` were sent from the Redis queue: memory does not send them again."""
        self.sent_from_queue = set(entries)
        if self.fresh:
            self.fresh = deque(item for item in self.fresh if item.entry not in self.sent_from_queue)

    def caught_up(self) -> None:
        """The whole queue was sent from Redis, and all that was queued since is known: what is left to
        send is what memory holds."""
        self.trusted = True


@dataclass
class Kept:
    """What was queued for a destination whose sender has not started (its lease is being claimed, or it
    waits for a sender's place), in order; None: not all of it is known. ``alone``: its send queue held
    nothing before that."""

    items: list[SendItem] | None
    alone: bool
    # As Lane.recheck.
    recheck: bool = False

    @classmethod
    def of(cls, items: Sequence[SendItem] | None, alone: bool) -> Kept:
        return cls(list(items) if items else None, alone and bool(items))

    def add(self, items: Sequence[SendItem] | None) -> int:
        """Keep ``items`` too (queued after the others); returns how many more are kept."""
        kept = self.items
        if kept is None:
            return 0
        if items is None or len(kept) + len(items) > KEPT_WHILE_UNTRUSTED:
            self.items, self.alone = None, False
            return -len(kept)
        kept.extend(items)
        return len(items)

    def __len__(self) -> int:
        return len(self.items) if self.items else 0
