"""The durable schedule of sending: what a failed send means, when a message tries again, gives up or
expires. Everything here is in Redis, so a restart loses none of it.

- A message that fails on its own (a refusal, not its peer being down) is scheduled in the outbox sorted set
  with its backoff; when it is due, the timer moves it back to its send queue (:meth:`Schedule.release_due`).
- A message whose peer is down waits in its send queue while the peer is probed
  (:mod:`msgbusd.sending.peers`).
  Without --hold-offline a request keeps go-rmb's meaning of ``try``: it gives up when its remaining tries,
  spaced by its backoff, would have run out had each of them been made and failed (the failed probes made
  meanwhile stand for those attempts). A reply gives up at its request's deadline, in both modes. Each
  entry's give-up time is written once, the first time it is read while the peer is down; when the peer
  answers again, those times are dropped and everything waiting is sent at once.
- A request past its deadline gets go-rmb's timeout error (:meth:`Schedule.expire_due`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from msgbusd.reports.event_log import EventLog
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics
from msgbusd.sending.send_items import SendItem, SendItems, destination_of
from msgbusd.store.queues import Outcome, Store
from wire import event_schema as ev
from wire import keys
from wire.backoff import Backoff
from wire.envelope import Envelope, EnvelopeDecodeError
from wire.error_texts import all_retries_done_text, expired_text

log = logging.getLogger("msgbusd.schedule")

# Re-sends released, or deadlines expired, per timer round; a full round is followed by another at once.
CLAIM_BATCH = 500
# Entries read per round trip, and at most per probe round, when writing give-up times.
READ_CHUNK = 500
NOTE_MAX = 5000
# Finished entries popped from the head of a queue per probe round at most.
TRIM_MAX = 5000


class Schedule:
    def __init__(
        self,
        store: Store,
        items: SendItems,
        *,
        backoff: Backoff,
        hold_offline: bool = False,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        events: EventLog | None = None,
    ) -> None:
        self._store = store
        self._items = items
        self.backoff = backoff
        self.hold_offline = hold_offline
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._events = events or EventLog(None, 0)

    # --- failed sends ------------------------------------------------------------------------------------

    async def refused(self, item: SendItem, cause: str, *, final: bool = False) -> None:
        """The peer refused ``item`` (it is up): schedule the next attempt, or give up."""
        if item.original is not None:
            await self._request_failed(item.uid, item.original, cause, final=final)
        else:
            await self._reply_failed(item.reply_key, item.envelope, item.state or {}, cause)

    async def _request_failed(self, uid: str, original: Envelope, cause: str, *, final: bool) -> None:
        """Count a failed attempt; schedule the next one, or give the caller the final error (at once when
        the failure is ``final``)."""
        failures = await self._store.record_failure(uid)
        dst = destination_of(uid)
        if failures <= original.retries and not final:
            delay = self.backoff.delay_s(failures)
            if await self._store.schedule_retry(uid, self._clock() + delay):
                self._metrics.message("retried")
                self._events.emit(
                    ev.RETRY_SCHEDULED,
                    original,
                    uid=uid,
                    dst=dst,
                    attempt=failures,
                    delay_ms=int(delay * 1000),
                    error=cause,
                )
                log.info(
                    "send of uid=%s to twin %s failed (%s); retry %d/%d in %.1fs",
                    uid,
                    dst,
                    cause,
                    failures,
                    original.retries,
                    delay,
                    extra=about(uid=uid, cmd=original.cmd, dst=dst),
                )
            return
        await self._fail(uid, original, failures, cause)

    async def failed_while_offline(self, items: Sequence[SendItem], cause: str) -> set[str]:
        """A send found the peer down (without --hold-offline): each request in it spent a try, and those
        with none left get their final error now; the others wait for the peer. Returns the send-queue
        entries that have their outcome now (nothing waits in them)."""
        requests = [item for item in items if item.original is not None]
        failures = await self._store.record_failures([item.uid for item in requests])
        finished = set()
        for item, failed in zip(requests, failures, strict=True):
            assert item.original is not None
            if failed > item.original.retries:
                await self._fail(item.uid, item.original, failed, cause)
            if failed == 0 or failed > item.original.retries:
                # (0: nothing was counted, it had its outcome already.)
                finished.add(item.entry)
        return finished

    async def give_up(self, item: SendItem, cause: str) -> None:
        """``item`` waited for its peer as long as it may: a request gets ``all retries done``, a reply is
        set aside."""
        if item.original is not None:
            await self._fail(item.uid, item.original, await self._store.record_failure(item.uid), cause)
        else:
            attempts = int((item.state or {}).get("attempts", 0)) + 1
            await self._give_up_reply(item.reply_key, item.envelope, attempts, cause)

    async def _fail(self, uid: str, original: Envelope, failures: int, cause: str) -> None:
        """Give the caller ``all retries done: <cause>`` (unless the request has its outcome already)."""
        dst = destination_of(uid)
        error = original.replace(src=dst or 0, err=all_retries_done_text(cause), now=int(self._clock()))
        if await self._store.finish(uid, original.ret, error.encode()):
            self._metrics.message("failed")
            self._events.emit(
                ev.FAILED, original, uid=uid, dst=dst, ret=original.ret, attempt=failures, error=error.err
            )
            log.warning(
                "request uid=%s cmd=%s to twin %s failed after %d attempts: %s",
                uid,
                original.cmd,
                dst,
                failures,
                cause,
                extra=about(uid=uid, cmd=original.cmd, dst=dst, queue=original.ret),
            )

    async def _reply_failed(self, key: str, env: Envelope, state: dict[str, float], cause: str) -> None:
        attempts = int(state.get("attempts", 0)) + 1
        now = self._clock()
        if now >= state.get("deadline", now):
            await self._give_up_reply(key, env, attempts, cause)
            return
        state = {**state, "attempts": attempts}
        await self._store.update_reply_state(key, state)
        delay = self.backoff.delay_s(attempts)
        await self._store.schedule_reply(key, now + delay)
        log.info(
            "reply uid=%s to twin %s failed (%s); retry in %.1fs",
            env.uid,
            env.dst[0],
            cause,
            delay,
            extra=about(uid=env.uid, cmd=env.cmd, dst=env.dst[0]),
        )

    async def _give_up_reply(self, key: str, env: Envelope, attempts: int, cause: str) -> None:
        # The requester has given its caller a timeout by now; keep the reply (or, at a relay, the message it
        # relays, its payload encrypted) for the operator.
        what = "reply" if keys.relayed_is_request(key) is None else "relayed message"
        await self._store.forget_reply(key)
        await self._store.set_aside(
            keys.REPLY, env.encode(), f"gave up forwarding {what} after {attempts} attempts: {cause}"
        )
        log.error(
            "gave up forwarding %s uid=%s to twin %s: %s",
            what,
            env.uid,
            env.dst[0],
            cause,
            extra=about(uid=env.uid, cmd=env.cmd, dst=env.dst[0]),
        )

    # --- messages waiting for a peer that is down -------------------------------------------------------

    def give_up_at(self, item: SendItem, now: float) -> float | None:
        """When ``item`` gives up waiting for its peer, counted from ``now`` (a failed probe); None: never
        (a request with --hold-offline waits until it expires)."""
        if item.original is None:
            return (item.state or {}).get("deadline", now)
        if self.hold_offline:
            return None
        # Attempt 1 was the send that found the peer down, or this probe for a request never sent.
        return now + self.backoff.total_s(max(item.failures, 1), item.original.retries)

    async def note(self, dst: int, cursor: int) -> tuple[int, float]:
        """Write the give-up times of ``dst``'s queue entries from index ``cursor`` on (a bounded number per
        call); returns the index to go on from next time, and the first time written (inf: none)."""
        noted, first = 0, math.inf
        while noted < NOTE_MAX:
            entries = await self._store.send_queue_range(dst, cursor, READ_CHUNK)
            if not entries:
                break
            cursor += len(entries)
            noted += len(entries)
            if self.hold_offline:
                # Requests wait until they expire: only replies have a time to give up.
                entries = [entry for entry in entries if not entry.startswith(keys.REQUEST_PREFIX)]
            now = self._clock()
            times = {}
            never_sent = []
            for item in await self._items.read(entries):
                at = self.give_up_at(item, now)
                if at is not None:
                    times[item.entry] = at
                    if item.original is not None and item.failures == 0:
                        never_sent.append(item.uid)
            # The failed probe was their first attempt (the rules router withdraws only such messages).
            await self._store.record_failures(never_sent, only_first=True)
            await self._store.add_give_ups(dst, times)
            first = min(first, *times.values()) if times else first
        return cursor, first

    async def give_up_due(self, dst: int, cause: str) -> int:
        """Give up the waiting messages of ``dst`` whose time has come (``cause``: why its peer is
        unreachable); returns how many entries were due."""
        entries = await self._store.due_give_ups(dst, self._clock(), CLAIM_BATCH)
        if not entries:
            return 0
        for item in await self._items.read(entries):
            await self.give_up(item, cause)
        await self._store.drop_give_ups(dst, entries)
        return len(entries)

    async def next_give_up_at(self, dst: int) -> float:
        """When the first of ``dst``'s waiting messages gives up (inf: none has a time)."""
        at = await self._store.first_give_up(dst)
        return math.inf if at is None else at

    async def trim(self, dst: int, batch: int) -> int:
        """Pop the entries at the head of ``dst``'s queue that have their outcome already (given up,
        expired); returns how many were popped."""
        dropped = 0
        while dropped < TRIM_MAX:
            entries = await self._store.send_queue_heads(dst, batch)
            if not entries:
                break
            live = {item.entry for item in await self._items.read(entries)}
            finished = next((i for i, entry in enumerate(entries) if entry in live), len(entries))
            if finished:
                await self._store.sent(dst, [], head=(entries[0], finished))
                dropped += finished
            if finished < len(entries) or len(entries) < batch:
                # A live entry leads the queue now, or the queue had no more (what came since is live).
                break
        return dropped

    async def forget(self, dst: int) -> None:
        """``dst`` answers again: nothing waiting for it gives up any more."""
        await self._store.forget_give_ups(dst)

    # --- timers ------------------------------------------------------------------------------------------

    async def release_due(self) -> tuple[set[int], bool]:
        """Move the re-sends whose time has come to their send queues; returns their destinations, and
        whether the round was full (more may be due)."""
        members = await self._store.release_due(self._clock(), CLAIM_BATCH)
        destinations = set()
        for member in members:
            dst = _member_destination(member)
            if dst is None:
                log.error("dropped unknown outbox entry %r", member)
            else:
                destinations.add(dst)
        return destinations, len(members) == CLAIM_BATCH

    async def expire_due(self) -> int:
        """Give requests past their deadline their timeout error, a batch at a time in two round trips;
        returns how many deadlines were dealt with (a full batch means: call again)."""
        uids = await self._store.due_deadlines(self._clock(), CLAIM_BATCH)
        if not uids:
            return 0
        entries = await self._store.load_entries([keys.REQUEST_PREFIX + uid for uid in uids])
        outcomes: list[Outcome] = []
        expired: list[tuple[str, Envelope]] = []
        for uid, (entry, _) in zip(uids, entries, strict=True):
            original = None if entry is None else _decode_or_none(entry)
            if original is None:
                await self._store.forget_request(uid)
                continue
            error = original.replace(
                uid=uid,
                src=destination_of(uid) or 0,
                err=expired_text(original.lifetime_s),
                now=int(self._clock()),
            )
            outcomes.append(Outcome(uid, original.ret, error.encode()))
            expired.append((uid, original))
        for (uid, original), deadline in zip(expired, await self._store.finish_many(outcomes), strict=True):
            if deadline is not None:
                self._metrics.message("expired")
                self._events.emit(
                    ev.EXPIRED,
                    original,
                    uid=uid,
                    dst=destination_of(uid),
                    ret=original.ret,
                    error=expired_text(original.lifetime_s),
                )
                log.warning(
                    "request uid=%s cmd=%s expired after %ss without a reply",
                    uid,
                    original.cmd,
                    original.lifetime_s,
                    extra=about(uid=uid, cmd=original.cmd, dst=destination_of(uid), queue=original.ret),
                )
        return len(uids)


def _member_destination(member: str) -> int | None:
    """The twin an outbox member (``req:<dst>.<n>`` or ``rep:<dst>|<uid>``) is for."""
    if member.startswith(keys.REQUEST_PREFIX):
        return destination_of(member.removeprefix(keys.REQUEST_PREFIX))
    head, sep, _ = member.removeprefix(keys.REPLY_PREFIX).partition("|")
    return int(head) if member.startswith(keys.REPLY_PREFIX) and sep and head.isdigit() else None


def _decode_or_none(entry: bytes) -> Envelope | None:
    try:
        return Envelope.decode(entry)
    except EnvelopeDecodeError:
        return None
