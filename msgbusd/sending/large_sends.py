"""A peer's large messages, each sent on its own beside the peer's batches.

A message whose payload is larger than the threshold is set aside when its batch is made
(:class:`msgbusd.sending.large_messages.LargeMessages` keeps which are sent and which wait for a slot): it
goes in a send of its own while the sender goes on with the rest. Its entry leaves the send queue once the
peer has it, or once its failure is in the schedule; then the next one waiting goes, read from Redis. One
that does not get through stays in the queue, and the sender reads it again from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from redis.exceptions import RedisError

from msgbusd.link.open_link import Link
from msgbusd.reports.logs import about
from msgbusd.sending.lanes import Lane
from msgbusd.sending.large_messages import LargeMessages
from msgbusd.sending.send_items import SendItem
from msgbusd.sending.senders import Senders

log = logging.getLogger("msgbusd.peers")


class Sender(Protocol):
    """A peer's sender, as its large messages see it (:class:`msgbusd.sending.peer.Peer`)."""

    @property
    def twin(self) -> int: ...

    @property
    def peers(self) -> Senders: ...

    @property
    def large(self) -> LargeMessages: ...

    @property
    def lane(self) -> Lane | None: ...

    async def deliver(
        self,
        lane: Lane,
        entries: list[str],
        items: list[SendItem],
        written: asyncio.Event | None = None,
        link: Link | None = None,
    ) -> tuple[int, list[str]]: ...


def set_aside(sender: Sender, items: list[SendItem]) -> list[SendItem]:
    """Start sending the large messages among ``items`` on their own (or keep them waiting for a slot);
    returns the others, to send as a batch."""
    if sender.large.threshold_bytes <= 0:
        return items
    batch, start = sender.large.set_aside(items)
    for item in start:
        sender.peers.spawn(send_large(sender, item), f"large message {item.entry} to twin {sender.twin}")
    return batch


async def send_large(sender: Sender, item: SendItem) -> None:
    """Send one large message; its entry leaves the send queue once the peer has it (or its failure is
    in the schedule). Then the next waiting one goes."""
    delivered = False
    following: str | None = None
    try:
        done, replies = await sender.deliver(sender.lane or Lane(), [item.entry], [item])
        await sender.peers.store.sent(sender.twin, replies, remove=[item.entry][:done])
        delivered = done == 1
    except (RedisError, OSError) as exc:
        log.warning(
            "sending %s to twin %s: redis failed (%s); it is sent again from the queue",
            item.entry,
            sender.twin,
            exc,
            extra=about(dst=sender.twin),
        )
    finally:
        following = sender.large.finished(item.entry, delivered=delivered)
        if not delivered and sender.lane is not None:
            # It waits in the queue, where the sender reads it again.
            sender.lane.distrust()
            sender.lane.wake.set()
    if following is not None:
        what = f"large message {following} to twin {sender.twin}"
        sender.peers.spawn(send_waiting_large(sender, following), what)


async def send_waiting_large(sender: Sender, entry: str | None) -> None:
    """Read a large message that waited for its slot, and send it."""
    while entry is not None:
        try:
            items = await sender.peers.items.read([entry])
        except (RedisError, OSError):
            sender.large.finished(entry, delivered=False)
            if sender.lane is not None:
                sender.lane.distrust()
                sender.lane.wake.set()
            return
        if items:
            await send_large(sender, items[0])
            return
        # Finished meanwhile (given up, expired): out of the queue, and the next one goes.
        with contextlib.suppress(RedisError, OSError):
            await sender.peers.store.sent(sender.twin, [], remove=[entry])
        entry = sender.large.finished(entry, delivered=True)
