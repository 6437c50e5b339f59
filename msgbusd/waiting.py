"""Messages waiting for a peer that is down: when each one gives up, and giving up those whose time came.

While a peer is down, its sender sends it nothing but probes, and its messages wait in its send queue, in
order. Without --hold-offline a request keeps go-rmb's meaning of ``try``: it gives up when its remaining
tries, spaced by its backoff, would have run out had each of them been made and failed (the failed probes
made meanwhile stand for those attempts). A reply gives up at its request's deadline, in both modes.
Each entry's give-up time is written once, the first time the sender reads it while the peer is down; when
the peer answers again, those times are dropped and everything waiting is sent at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from msgbusd.outbox import CLAIM_BATCH, Outbox, SendItem
from msgbusd.queues import Store

# Entries read per round trip, and at most per probe round, when writing give-up times.
READ_CHUNK = 500
NOTE_MAX = 5000
# Finished entries popped from the head of a queue per probe round at most.
TRIM_MAX = 5000


class Waiting:
    def __init__(self, store: Store, outbox: Outbox, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._outbox = outbox
        self._clock = clock

    def give_up_at(self, item: SendItem, now: float) -> float | None:
        """When ``item`` gives up waiting for its peer, counted from ``now`` (a failed probe); None: never
        (a request with --hold-offline waits until it expires)."""
        if item.original is None:
            return (item.state or {}).get("deadline", now)
        if self._outbox.hold_offline:
            return None
        # Attempt 1 was the send that found the peer down, or this probe for a request never sent.
        return now + self._outbox.backoff.total_s(max(item.failures, 1), item.original.retries)

    async def note(self, dst: int, cursor: int) -> int:
        """Write the give-up times of ``dst``'s queue entries from index ``cursor`` on (a bounded number per
        call); returns the index to go on from next time."""
        noted = 0
        while noted < NOTE_MAX:
            entries = await self._store.send_queue_range(dst, cursor, READ_CHUNK)
            if not entries:
                break
            now = self._clock()
            times = {}
            never_sent = []
            for item in await self._outbox.prepare(entries):
                at = self.give_up_at(item, now)
                if at is not None:
                    times[item.entry] = at
                    if item.original is not None and item.failures == 0:
                        never_sent.append(item.uid)
            # The failed probe was their first attempt (the rules router withdraws only such messages).
            await self._store.record_failures(never_sent, only_first=True)
            await self._store.add_give_ups(dst, times)
            cursor += len(entries)
            noted += len(entries)
        return cursor

    async def give_up_due(self, dst: int) -> int:
        """Give up the waiting messages of ``dst`` whose time has come; returns how many entries were due."""
        entries = await self._store.due_give_ups(dst, self._clock(), CLAIM_BATCH)
        if not entries:
            return 0
        cause = self._outbox.unreachable_cause(dst)
        for item in await self._outbox.prepare(entries):
            await self._outbox.give_up(item, cause)
        await self._store.drop_give_ups(dst, entries)
        return len(entries)

    async def trim(self, dst: int, batch: int) -> int:
        """Pop the entries at the head of ``dst``'s queue that have their outcome already (given up,
        expired); returns how many were popped."""
        dropped = 0
        while dropped < TRIM_MAX:
            entries = await self._store.send_queue_heads(dst, batch)
            if not entries:
                break
            live = {item.entry for item in await self._outbox.prepare(entries)}
            finished = next((i for i, entry in enumerate(entries) if entry in live), len(entries))
            if finished:
                await self._store.sent(dst, [], head=(entries[0], finished))
                dropped += finished
            if finished < len(entries):
                break
        return dropped

    async def forget(self, dst: int) -> None:
        """``dst`` answers again: nothing waiting for it gives up any more."""
        await self._store.forget_give_ups(dst)
