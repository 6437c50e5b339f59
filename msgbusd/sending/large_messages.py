"""Large messages to one twin, sent beside the others instead of in front of them.

A sender sends its queue in order, a batch at a time, and waits for a batch's answers before the next: a
message of 8 MiB on a cable of 2 Mbit/s would hold everything queued after it for 45 s. A message whose
payload is larger than the threshold is set aside instead: it goes in a send of its own (over a link its
frame is cut into parts that take turns with the other frames), at most :data:`SLOTS` at once per twin,
while the sender goes on with the rest. The others wait here as their send-queue entries only (their
envelopes stay in Redis until their turn). Every such entry stays in the send queue until the peer has the
message, so a crash sends it again; meanwhile the sender reads and takes out the entries around it.

What it costs: a smaller message sent after a large one may arrive first.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgbusd.sending.send_items import SendItem

# Large messages sent to one twin at once, at most (each is held in memory while it is sent).
SLOTS = 2


class LargeMessages:
    """The large messages of one destination that are being sent, or wait for a slot. Every peer has one
    (thousands at once): it holds two short lists."""

    __slots__ = ("_sending", "_waiting", "slots", "threshold_bytes")

    def __init__(self, threshold_bytes: int, slots: int = SLOTS) -> None:
        # 0: no message is set aside.
        self.threshold_bytes = threshold_bytes
        self.slots = slots
        self._sending: list[str] = []
        self._waiting: list[str] = []

    def is_large(self, item: SendItem) -> bool:
        return 0 < self.threshold_bytes < len(item.envelope.dat)

    @property
    def busy(self) -> bool:
        return bool(self._sending or self._waiting)

    @property
    def entries(self) -> list[str]:
        """Every entry set aside, being sent or waiting: the sender reads and sends around them."""
        return [*self._sending, *self._waiting]

    def __contains__(self, entry: str) -> bool:
        return entry in self._sending or entry in self._waiting

    def set_aside(self, items: Sequence[SendItem]) -> tuple[list[SendItem], list[SendItem]]:
        """Split ``items``: those to send now with the batch, and the large ones to send now on their own
        (a slot was free); the other large ones wait here for a slot."""
        batch: list[SendItem] = []
        start: list[SendItem] = []
        for item in items:
            if item.entry in self or not self.is_large(item):
                if item.entry not in self:
                    batch.append(item)
            elif len(self._sending) < self.slots:
                self._sending.append(item.entry)
                start.append(item)
            else:
                self._waiting.append(item.entry)
        return batch, start

    def finished(self, entry: str, *, delivered: bool) -> str | None:
        """``entry``'s send ended; returns the next waiting entry to send now, if any. A send that did not
        get through forgets the waiting ones: they are in the queue, which the sender reads again."""
        self._forget(entry)
        if not delivered:
            self._waiting.clear()
            return None
        if self._waiting and len(self._sending) < self.slots:
            following = self._waiting.pop(0)
            self._sending.append(following)
            return following
        return None

    def _forget(self, entry: str) -> None:
        if entry in self._sending:
            self._sending.remove(entry)
