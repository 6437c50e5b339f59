"""Sending requests and replies to other sites: what goes on the wire, what a failure means, and expiry.

Every send to a destination goes through its send queue and its sender (:mod:`msgbusd.senders`), in
batches and in order. A message that fails on its own (a refusal, not its peer being down) is scheduled in
the outbox sorted set with its backoff; when it is due, the retry timer moves it back to its send queue.
Messages whose peer is down wait in the send queue (see :mod:`msgbusd.waiting`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from msgbusd import event_schema as ev
from msgbusd import keys
from msgbusd.backoff import Backoff
from msgbusd.envelope import Envelope, EnvelopeDecodeError
from msgbusd.errors import DeliveryError, all_retries_done_text, expired_text
from msgbusd.event_log import EventLog
from msgbusd.forwarder import REMOTE_PATH, REPLY_PATH, Forwarder
from msgbusd.health import PeerHealth
from msgbusd.logs import about
from msgbusd.metrics import Metrics
from msgbusd.queues import Outcome, Store

log = logging.getLogger("msgbusd.outbox")

# Re-sends released, or deadlines expired, per timer round; a full round is followed by another at once.
CLAIM_BATCH = 500


def destination_of(uid: str) -> int | None:
    """The twin a ``<dst>.<n>`` uid was issued for, or None for a uid that is not of that form."""
    head, _, tail = uid.partition(".")
    if not tail.isdigit():
        return None
    try:
        return int(head)
    except ValueError:
        return None


@dataclass(frozen=True)
class SendItem:
    """One entry of a send queue, ready to go: the envelope to send and what to do with its outcome."""

    entry: str
    path: str
    envelope: Envelope
    original: Envelope | None = None
    state: dict[str, float] | None = None
    # A request's failed attempts before this send.
    failures: int = 0

    @property
    def uid(self) -> str:
        return self.entry.removeprefix(keys.REQUEST_PREFIX)

    @property
    def reply_key(self) -> str:
        return self.entry.removeprefix(keys.REPLY_PREFIX)


class Outbox:
    def __init__(
        self,
        store: Store,
        forwarder: Forwarder,
        twin: int,
        health: PeerHealth,
        *,
        backoff: Backoff,
        hold_offline: bool = False,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.events = events or EventLog(None, twin)
        self._store = store
        self._forwarder = forwarder
        self._twin = twin
        self.health = health
        self.hold_offline = hold_offline
        self.backoff = backoff
        self._clock = clock

    # --- first attempts, in batches (see msgbusd.senders) ------------------------------------------------

    async def prepare(self, entries: list[str]) -> list[SendItem]:
        """The send-queue entries that still have something to send (finished ones are left out)."""
        items = []
        for entry, (first, second) in zip(
            entries, await self._store.load_entries(entries, attempts=True), strict=True
        ):
            item = await self._item(entry, first, second)
            if item is not None:
                items.append(item)
        return items

    async def _item(self, entry: str, first: bytes | None, second: bytes | None) -> SendItem | None:
        """The item of send-queue ``entry``: ``first`` and ``second`` are a reply's payload and state, or a
        request's backlog entry and failed attempts."""
        if entry.startswith(keys.REPLY_PREFIX):
            key = entry.removeprefix(keys.REPLY_PREFIX)
            if first is None:
                return None
            try:
                env = Envelope.decode(first)
            except EnvelopeDecodeError as exc:
                await self._store.forget_reply(key)
                log.error("dropped unreadable pending reply %s: %s", key, exc.reason)
                return None
            return self.reply_item(key, env, json.loads(second) if second else {})
        uid = entry.removeprefix(keys.REQUEST_PREFIX)
        original = await self._original_from(uid, first)
        return None if original is None else self.request_item(uid, original, int(second or 0))

    def request_item(self, uid: str, original: Envelope, failures: int = 0) -> SendItem:
        return SendItem(
            keys.REQUEST_PREFIX + uid,
            REMOTE_PATH,
            self.forwarded_copy(original, uid, failures),
            original=original,
            failures=failures,
        )

    @staticmethod
    def reply_item(key: str, env: Envelope, state: dict[str, float]) -> SendItem:
        return SendItem(keys.REPLY_PREFIX + key, REPLY_PATH, env, state=state)

    async def send_items(self, dst: int, items: list[SendItem]) -> list[DeliveryError | None]:
        """Send a batch to ``dst``; one result per item (None: the peer has it)."""
        started_at, started = self._clock(), time.perf_counter()
        results = await self._forwarder.send_many(dst, [(item.path, item.envelope) for item in items])
        duration_us = _micros_since(started)
        for item, error in zip(items, results, strict=True):
            if error is not None and not error.attempted:
                continue
            if error is not None:
                self.metrics.error(error.kind)
            self._record_send(item, error, started_at, duration_us)
        return results

    def _record_send(
        self, item: SendItem, error: DeliveryError | None, started_at: float, duration_us: int
    ) -> None:
        env = item.envelope
        if item.original is not None:
            attempt = item.original.retries - env.retries + 1
        else:
            attempt = int((item.state or {}).get("attempts", 0)) + 1
        self._record_attempt(item.original is not None, env, attempt, started_at, duration_us, error)

    def _record_attempt(
        self,
        is_request: bool,
        env: Envelope,
        attempt: int,
        started_at: float,
        duration_us: int,
        error: DeliveryError | None,
    ) -> None:
        """The event log's line for one POST of a request or a reply (``env`` is what went on the wire)."""
        if not self.events.enabled:
            return
        if is_request:
            event = ev.SENT if error is None else ev.SEND_FAILED
            direction: dict[str, int] = {}
        else:
            event = ev.REPLY_SENT if error is None else ev.REPLY_FAILED
            # Events name the request's direction; a reply travels the other way.
            direction = {"src": env.dst[0], "dst": env.src}
        self.events.emit(
            event,
            env,
            at=started_at,
            attempt=attempt,
            duration_us=duration_us,
            status=200 if error is None else None,
            error=error.cause if error else None,
            **direction,
        )

    def items_sent(self, items: list[SendItem]) -> list[str]:
        """The peer has these: count them; returns the keys of the replies among them, for the sender to
        forget (requests now wait for their reply)."""
        replies = [item.reply_key for item in items if item.original is None]
        if replies:
            self.metrics.message("reply_sent", len(replies))
        if len(replies) < len(items):
            self.metrics.message("sent", len(items) - len(replies))
        for item in items:
            log.debug(
                "sent %s to twin %s",
                item.entry,
                item.envelope.dst[0],
                extra=about(uid=item.envelope.uid, cmd=item.envelope.cmd, dst=item.envelope.dst[0]),
            )
        return replies

    async def item_failed(self, item: SendItem, cause: str, *, final: bool = False) -> None:
        if item.original is not None:
            await self.failed(item.uid, item.original, cause, final=final)
        else:
            await self._reply_failed(item.reply_key, item.envelope, item.state or {}, cause)

    # --- requests ----------------------------------------------------------------------------------------

    def forwarded_copy(self, original: Envelope, uid: str, failures: int) -> Envelope:
        """What goes over the wire for one destination: its own uid, our twin as src, tries left."""
        dst = destination_of(uid)
        assert dst is not None, uid
        return original.replace(
            uid=uid,
            src=self._twin,
            dst=(dst,),
            ret=keys.REPLY,
            retries=max(0, original.retries - failures),
            pxy=False,
            err="",
            sig="",
        )

    async def probe(self, dst: int) -> DeliveryError | None:
        """One cheap request to ``dst``'s site: None if it answers."""
        error = await self._forwarder.probe(dst)
        self.metrics.message("probed")
        return error

    def unreachable_cause(self, dst: int) -> str:
        return f"twin {dst} is unreachable ({self.health.last_cause(dst)})"

    async def failed(self, uid: str, original: Envelope, cause: str, *, final: bool = False) -> None:
        """Count a failed attempt; schedule the next one, or give the caller the final error (at once when
        the failure is ``final``)."""
        failures = await self._store.record_failure(uid)
        dst = destination_of(uid)
        if failures <= original.retries and not final:
            delay = self.backoff.delay_s(failures)
            if await self._store.schedule_retry(uid, self._clock() + delay):
                self.metrics.message("retried")
                self.events.emit(
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

    async def failed_while_offline(self, items: Sequence[SendItem], cause: str) -> None:
        """A send found the peer down (without --hold-offline): each request in it spent a try, and those
        with none left get their final error now; the others wait for the peer."""
        requests = [item for item in items if item.original is not None]
        failures = await self._store.record_failures([item.uid for item in requests])
        for item, failed in zip(requests, failures, strict=True):
            assert item.original is not None
            if failed > item.original.retries:
                await self._fail(item.uid, item.original, failed, cause)

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
            self.metrics.message("failed")
            self.events.emit(
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

    # --- replies -----------------------------------------------------------------------------------------

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
        # The requester has given its caller a timeout by now; keep the reply for the operator.
        await self._store.forget_reply(key)
        await self._store.set_aside(
            keys.REPLY, env.encode(), f"gave up forwarding reply after {attempts} attempts: {cause}"
        )
        log.error(
            "gave up forwarding reply uid=%s to twin %s: %s",
            env.uid,
            env.dst[0],
            cause,
            extra=about(uid=env.uid, cmd=env.cmd, dst=env.dst[0]),
        )

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
                self.metrics.message("expired")
                self.events.emit(
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

    async def _original_from(self, uid: str, entry: bytes | None) -> Envelope | None:
        """The decoded backlog ``entry`` of ``uid``; None when it is gone (the request has its outcome, and
        the script that gave it cleaned its bookkeeping) or unreadable (its bookkeeping cleaned here)."""
        if entry is None:
            return None
        try:
            return Envelope.decode(entry)
        except EnvelopeDecodeError as exc:
            log.error(
                "backlog entry of uid=%s is unreadable (%s); dropping it",
                uid,
                exc.reason,
                extra=about(uid=uid),
            )
            await self._store.forget_request(uid)
            return None


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


def _micros_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1_000_000)
