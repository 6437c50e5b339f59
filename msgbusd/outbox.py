"""Sending requests and replies to other sites, retrying what failed, and expiring what waited too long.

First attempts of requests go out in order through each destination's send queue (:mod:`msgbusd.senders`).
Re-sends and replies to forward live in the outbox sorted set by due time; a send in flight is leased (its
due time pushed past the HTTP timeout), so if the daemon dies mid-send the timer takes it up again later.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

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
from msgbusd.queues import Outcome, Store, reply_member, request_member

log = logging.getLogger("msgbusd.outbox")

# Members claimed per timer tick; the rest wait for the next tick.
CLAIM_BATCH = 500

Spawn = Callable[[Coroutine[Any, Any, None]], None]


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
        send_timeout_s: float,
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
        self._lease_s = send_timeout_s + 5.0
        self._backoff = backoff
        self._clock = clock

    def lease_until(self) -> float:
        return self._clock() + self._lease_s

    # --- first attempts, in batches (see msgbusd.senders) ------------------------------------------------

    async def prepare(self, entries: list[str]) -> list[SendItem]:
        """The send-queue entries that still have something to send (finished ones are left out)."""
        items = []
        for entry, (first, second) in zip(entries, await self._store.load_entries(entries), strict=True):
            item = await self._item(entry, first, second)
            if item is not None:
                items.append(item)
        return items

    async def _item(self, entry: str, first: bytes | None, second: bytes | None) -> SendItem | None:
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
        return None if original is None else self.request_item(uid, original)

    def request_item(self, uid: str, original: Envelope) -> SendItem:
        return SendItem(
            keys.REQUEST_PREFIX + uid, REMOTE_PATH, self.forwarded_copy(original, uid, 0), original=original
        )

    @staticmethod
    def reply_item(key: str, env: Envelope, state: dict[str, float]) -> SendItem:
        return SendItem(keys.REPLY_PREFIX + key, REPLY_PATH, env, state=state)

    async def send_items(self, dst: int, items: list[SendItem]) -> list[DeliveryError | None]:
        """Send a batch to ``dst``, keeping the peer's health up to date."""
        started_at, started = self._clock(), time.perf_counter()
        results = await self._forwarder.send_many(dst, [(item.path, item.envelope) for item in items])
        duration_us = _micros_since(started)
        for item, error in zip(items, results, strict=True):
            if error is not None:
                self.metrics.error(error.kind)
            self._record_send(item, error, started_at, duration_us)
        offline = next((r for r in results if r is not None and r.offline), None)
        if offline is not None:
            self.health.unreachable(dst, offline.cause)
        elif any(r is None for r in results):
            self.health.succeeded(dst)
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

    async def items_sent(self, items: list[SendItem]) -> None:
        """The peer has these: forget the replies among them (requests now wait for their reply)."""
        replies = [item.reply_key for item in items if item.original is None]
        if replies:
            await self._store.forget_replies(replies)
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

    async def deliver(self, uid: str, original: Envelope, failures: int) -> DeliveryError | None:
        """One send of request ``uid``; returns what went wrong, or None once the peer has it."""
        env = self.forwarded_copy(original, uid, failures)
        dst = env.dst[0]
        started_at, started = self._clock(), time.perf_counter()
        try:
            await self._forwarder.send(env, REMOTE_PATH)
        except DeliveryError as exc:
            if exc.offline:
                self.health.unreachable(dst, exc.cause)
            self.metrics.error(exc.kind)
            self._record_attempt(True, env, failures + 1, started_at, _micros_since(started), exc)
            return exc
        self._record_attempt(True, env, failures + 1, started_at, _micros_since(started), None)
        self.health.succeeded(dst)
        self.metrics.message("sent")
        log.debug(
            "sent request uid=%s cmd=%s to twin %s",
            uid,
            env.cmd,
            dst,
            extra=about(uid=uid, cmd=env.cmd, dst=dst),
        )
        return None

    def unreachable_cause(self, dst: int) -> str:
        return f"twin {dst} is unreachable ({self.health.last_cause(dst)})"

    async def failed(self, uid: str, original: Envelope, cause: str, *, final: bool = False) -> None:
        """Count a failed attempt; schedule the next one, or give the caller the final error (at once when
        the failure is ``final``)."""
        failures = await self._store.record_failure(uid)
        dst = destination_of(uid)
        if failures <= original.retries and not final:
            delay = self._backoff.delay_s(failures)
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

    async def _resend_request(self, uid: str) -> None:
        original = await self.load_original(uid)
        if original is None:
            return
        member = request_member(uid)
        dst = destination_of(uid) or 0
        if not self.health.may_send(dst):
            if self.hold_offline:
                await self._store.reschedule(member, self._clock() + self.health.seconds_until_probe(dst))
            else:
                await self.failed(uid, original, self.unreachable_cause(dst))
            return
        error = await self.deliver(uid, original, await self._store.failures(uid))
        if error is None:
            await self._store.sent(member)
        elif error.offline and self.hold_offline:
            await self._store.reschedule(member, self._clock() + self.health.seconds_until_probe(dst))
        else:
            await self.failed(uid, original, error.cause, final=error.final)

    # --- replies -----------------------------------------------------------------------------------------

    async def attempt_reply(self, key: str, env: Envelope, state: dict[str, float]) -> None:
        """One attempt to forward a service's reply to the twin that asked."""
        dst = env.dst[0]
        if not self.health.may_send(dst):
            await self._store.reschedule(
                reply_member(key), self._clock() + self.health.seconds_until_probe(dst)
            )
            return
        attempt = int(state.get("attempts", 0)) + 1
        started_at, started = self._clock(), time.perf_counter()
        try:
            await self._forwarder.send(env, REPLY_PATH)
        except DeliveryError as exc:
            if exc.offline:
                self.health.unreachable(dst, exc.cause)
            self._record_attempt(False, env, attempt, started_at, _micros_since(started), exc)
            await self._reply_failed(key, env, state, exc.cause)
            return
        self._record_attempt(False, env, attempt, started_at, _micros_since(started), None)
        self.health.succeeded(dst)
        self.metrics.message("reply_sent")
        await self._store.forget_reply(key)
        log.debug(
            "sent reply uid=%s cmd=%s to twin %s",
            env.uid,
            env.cmd,
            dst,
            extra=about(uid=env.uid, cmd=env.cmd, dst=dst),
        )

    async def _reply_failed(self, key: str, env: Envelope, state: dict[str, float], cause: str) -> None:
        attempts = int(state.get("attempts", 0)) + 1
        now = self._clock()
        if now >= state.get("deadline", now):
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
            return
        state = {**state, "attempts": attempts}
        await self._store.update_reply_state(key, state)
        delay = self._backoff.delay_s(attempts)
        await self._store.schedule_reply(key, now + delay)
        log.info(
            "reply uid=%s to twin %s failed (%s); retry in %.1fs",
            env.uid,
            env.dst[0],
            cause,
            delay,
            extra=about(uid=env.uid, cmd=env.cmd, dst=env.dst[0]),
        )

    async def _resend_reply(self, key: str) -> None:
        pending = await self._store.pending_reply(key)
        if pending is None:
            await self._store.forget_reply(key)
            return
        payload, state = pending
        try:
            env = Envelope.decode(payload)
        except EnvelopeDecodeError as exc:
            await self._store.forget_reply(key)
            log.error("dropped unreadable pending reply %s: %s", key, exc.reason)
            return
        await self.attempt_reply(key, env, state)

    # --- timers ------------------------------------------------------------------------------------------

    async def run_due(self, spawn: Spawn, limit: int = CLAIM_BATCH) -> int:
        """Start the re-sends whose time has come, at most ``limit``; returns how many."""
        members = await self._store.claim_due(self._clock(), self.lease_until(), min(limit, CLAIM_BATCH))
        for member in members:
            spawn(self._resend(member))
        return len(members)

    async def _resend(self, member: str) -> None:
        if member.startswith(keys.REQUEST_PREFIX):
            await self._resend_request(member.removeprefix(keys.REQUEST_PREFIX))
        elif member.startswith(keys.REPLY_PREFIX):
            await self._resend_reply(member.removeprefix(keys.REPLY_PREFIX))
        else:
            await self._store.sent(member)
            log.error("dropped unknown outbox entry %r", member)

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

    async def load_original(self, uid: str) -> Envelope | None:
        """The backlog entry of ``uid``, or None (bookkeeping cleaned) if it already has an outcome."""
        return await self._original_from(uid, await self._store.backlog_entry(uid))

    async def _original_from(self, uid: str, entry: bytes | None) -> Envelope | None:
        """The decoded backlog ``entry`` of ``uid``; None, with the request's bookkeeping cleaned, when it
        is gone (the request has its outcome) or unreadable."""
        if entry is None:
            await self._store.forget_request(uid)
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


def _decode_or_none(entry: bytes) -> Envelope | None:
    try:
        return Envelope.decode(entry)
    except EnvelopeDecodeError:
        return None


def _micros_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1_000_000)
