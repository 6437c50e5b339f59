"""What the daemon does with one item of each system queue.

Each handler owns the item it is given: it either hands it off (removing it from the processing list in the
same transaction), or dead-letters it with a reason. An exception leaves the item in the processing list,
from where the next start of the daemon takes it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from msgbusd.door.validation import validate
from msgbusd.errors import InvalidMessage
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics
from msgbusd.sending.send_items import SendItem, SendItems, destination_of
from msgbusd.store.queues import (
    REPLY_KEY_TAKEN,
    REPLY_QUEUED,
    AcceptedRequest,
    Outcome,
    PendingReply,
    Store,
    already_waiting_text,
)
from wire import event_schema as ev
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError

log = logging.getLogger("msgbusd.handlers")

# The latest requests accepted by this run, remembered so that their replies are handed over without reading
# the backlog back (the hand-over script still checks the entry); older ones are read from Redis. Enough for
# the replies in flight at full speed, and a bound on memory (about 330 bytes each) whatever waits in Redis.
REMEMBERED_REQUESTS = 10_000


class Handlers:
    def __init__(
        self,
        store: Store,
        items: SendItems,
        twin: int,
        on_accepted: Callable[[Mapping[int, list[SendItem] | None], set[int]], None],
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        events: EventLog | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._events = events or EventLog(None, twin)
        self._store = store
        self._items = items
        self._twin = twin
        self._on_accepted = on_accepted
        self._clock = clock
        # uid -> (the caller's return queue, the request's lifetime in seconds)
        self._open: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # Held while requests made inside the daemon wait in the local processing list to be accepted: the
        # local queue's taker takes that list back only outside it (on taking the queue again, e.g. after
        # this instance was taken for dead), or it would accept them itself and :meth:`submit` would get no
        # uid for them.
        self.staging = asyncio.Lock()

    async def _dead_letter(self, queue: str, raw: bytes, reason: str) -> None:
        await self._store.dead_letter(queue, raw, reason)
        self._metrics.message("dead_lettered")

    async def _set_aside(self, queue: str | None, raw: bytes, env: Envelope, reason: str) -> None:
        """Dead-letter a popped item (acking it), or a message that was never in a queue."""
        if queue is not None:
            await self._dead_letter(queue, raw, reason)
            return
        await self._store.set_aside(keys.REPLY, env.encode(), reason)
        self._metrics.message("dead_lettered")

    async def _decode(self, queue: str, raw: bytes) -> Envelope | None:
        try:
            return Envelope.decode(raw)
        except EnvelopeDecodeError as exc:
            await self._dead_letter(queue, raw, f"not an envelope: {exc.reason}")
            log.error(
                "dead-lettered an undecodable item from %s: %s", queue, exc.reason, extra=about(queue=queue)
            )
            return None

    # --- msgbus.system.local: requests from local clients ------------------------------------------------

    async def local(self, raws: list[bytes]) -> None:
        """Accept a batch of local requests, in order, in one round trip for the valid ones."""
        await self._accept_local(raws)

    async def submit(self, requests: list[Envelope]) -> list[list[str] | None]:
        """Accept requests made inside the daemon (the rules router) as if a local client had pushed
        them; returns each one's uids (one per destination), or None for one refused as invalid."""
        raws = [request.encode() for request in requests]
        async with self.staging:
            await self._store.stage_local(raws)
            accepted = await self._accept_local(raws, staged=True)
        return [accepted.get(index) for index in range(len(raws))]

    async def _accept_local(self, raws: list[bytes], *, staged: bool = False) -> dict[int, list[str]]:
        valid: list[tuple[bytes, Envelope]] = []
        positions: list[int] = []
        for position, raw in enumerate(raws):
            env = await self._decode(keys.LOCAL, raw)
            if env is None:
                continue
            try:
                validate(env)
            except InvalidMessage as exc:
                await self._refuse_local(raw, env, exc)
                continue
            valid.append((raw, env))
            positions.append(position)
        if not valid:
            return {}
        now = self._clock()
        requests = []
        originals = []
        for raw, env in valid:
            # A local client cannot ask for the proxy flow; honouring it would loop the reply back here.
            original = env.replace(now=int(now), src=self._twin, pxy=False, sig="")
            requests.append(AcceptedRequest(raw, original.encode(), now + env.lifetime_s, env.dst, staged))
            originals.append(original)
        accepted = await self._store.accept_requests(requests)
        ready: dict[int, list[SendItem] | None] = {}
        uids_at: dict[int, list[str]] = {}
        queue_lengths: dict[int, int] = {}
        for position, original, queued in zip(positions, originals, accepted, strict=True):
            if queued is None:
                # Accepted by an earlier try whose answer was lost: queued, but not by us just now.
                ready.update(dict.fromkeys(original.dst))
                continue
            uids = queued.uids
            queue_lengths.update(zip(original.dst, queued.queue_lengths, strict=True))
            log.debug(
                "accepted request cmd=%s ret=%s uids=%s",
                original.cmd,
                original.ret,
                ",".join(uids),
                extra=about(uid=",".join(uids), cmd=original.cmd, queue=original.ret),
            )
            uids_at[position] = uids
            self._metrics.message("accepted", len(uids))
            for uid, dst in zip(uids, original.dst, strict=True):
                self._remember(uid, original)
                self._events.emit(ev.ACCEPTED, original, uid=uid, dst=dst, ret=original.ret)
                items = ready.setdefault(dst, [])
                if items is not None:
                    items.append(self._items.request(uid, original))
        # Send queues that hold nothing but what was just queued: their senders know them whole.
        alone = {dst for dst, items in ready.items() if items and queue_lengths.get(dst) == len(items)}
        self._on_accepted(ready, alone)
        return uids_at

    def _remember(self, uid: str, original: Envelope) -> None:
        self._open[uid] = (original.ret, original.lifetime_s)
        if len(self._open) > REMEMBERED_REQUESTS:
            self._open.popitem(last=False)

    async def _refuse_local(self, raw: bytes, env: Envelope, exc: InvalidMessage) -> None:
        self._metrics.error("invalid")
        if not env.ret or keys.is_system_queue(env.ret):
            await self._dead_letter(keys.LOCAL, raw, exc.wire_text)
            log.error(
                "dead-lettered local request cmd=%r without a usable return queue: %s",
                env.cmd,
                exc,
                extra=about(cmd=env.cmd, queue=keys.LOCAL),
            )
            return
        error = env.replace(err=exc.wire_text, src=self._twin, now=int(self._clock()))
        await self._store.hand_to_caller(keys.LOCAL, raw, env.ret, error.encode())
        log.info(
            "refused local request cmd=%r ret=%s: %s",
            env.cmd,
            env.ret,
            exc.wire_text,
            extra=about(cmd=env.cmd, queue=env.ret),
        )

    # --- msgbus.system.remote: requests from other sites, to run here -------------------------------------

    async def remote(self, raws: list[bytes]) -> None:
        """Hand a batch of requests from other sites to their services, in order, in one round trip."""
        hand_overs = []
        handed_envelopes = []
        for raw in raws:
            env = await self._decode(keys.REMOTE, raw)
            if env is None:
                continue
            try:
                validate(env, need_destination=not env.pxy)
            except InvalidMessage as exc:
                # The sender waits for an answer to this uid: send the error back as the reply.
                error = env.replace(
                    src=self._twin, dst=(env.src,), err=exc.wire_text, dat="", now=int(self._clock())
                )
                log.info(
                    "refused request uid=%s from twin %s: %s",
                    env.uid,
                    env.src,
                    exc.wire_text,
                    extra=about(uid=env.uid, cmd=env.cmd, src=env.src),
                )
                await self._route_reply(keys.REMOTE, raw, error)
                continue
            hand_overs.append((raw, keys.command_queue(env.cmd), raw))
            handed_envelopes.append(env)
            log.debug(
                "queueing request uid=%s from twin %s for %s",
                env.uid,
                env.src,
                env.cmd,
                extra=about(uid=env.uid, cmd=env.cmd, src=env.src, queue=keys.command_queue(env.cmd)),
            )
        if hand_overs:
            handed = await self._store.hand_over_many(keys.REMOTE, hand_overs)
            self._metrics.message("delivered_to_service", len(hand_overs))
            for env, (_raw, queue, _payload), done in zip(handed_envelopes, hand_overs, handed, strict=True):
                if done:
                    self._events.emit(ev.HANDED_TO_SERVICE, env, queue=queue)

    # --- msgbus.system.reply: replies from local services and from other sites ----------------------------

    async def reply(self, raws: list[bytes]) -> None:
        """Route a batch of replies: to local callers, or on to the twins that asked, in a few round trips."""
        deliveries: list[tuple[bytes, Envelope]] = []
        forwards: list[tuple[bytes, Envelope]] = []
        for raw in raws:
            env = await self._decode(keys.REPLY, raw)
            if env is None:
                continue
            if not env.pxy and env.dst and env.dst[0] == self._twin:
                if env.src == self._twin:
                    # A local service answering a request this site sent to itself.
                    self._events.emit(ev.REPLY_TAKEN, env, src=self._twin, dst=self._twin)
                deliveries.append((raw, env))
            elif not env.pxy and env.dst and env.src == self._twin:
                forwards.append((raw, env))
            else:
                await self._route_reply(keys.REPLY, raw, env)
        if deliveries:
            await self._deliver_replies(keys.REPLY, deliveries)
        if forwards:
            await self._forward_replies(keys.REPLY, forwards)

    async def _route_reply(self, queue: str, raw: bytes, env: Envelope) -> None:
        if env.pxy:
            await self._reply_to_proxy_client(queue, raw, env)
        elif not env.dst:
            await self._dead_letter(queue, raw, "reply has no destination twin")
        elif env.dst[0] == self._twin:
            await self._deliver_replies(queue, [(raw, env)])
        elif env.src == self._twin:
            await self._forward_replies(queue, [(raw, env)])
        else:
            reason = (
                f"reply from twin {env.src} to twin {env.dst[0]} does not concern this twin ({self._twin})"
            )
            await self._dead_letter(queue, raw, reason)
            log.error(
                "dead-lettered reply uid=%s: %s", env.uid, reason, extra=about(uid=env.uid, src=env.src)
            )

    async def _reply_to_proxy_client(self, queue: str, raw: bytes, env: Envelope) -> None:
        if not env.ret or keys.is_system_queue(env.ret):
            await self._dead_letter(queue, raw, "proxy reply without a client return queue")
            log.error(
                "dead-lettered proxy reply uid=%s: no client return queue", env.uid, extra=about(uid=env.uid)
            )
            return
        await self._store.hand_to_caller(queue, raw, env.ret, env.encode())
        log.debug(
            "proxy reply uid=%s stored in %s", env.uid, env.ret, extra=about(uid=env.uid, queue=env.ret)
        )

    async def deliver_from_peers(self, replies: list[Envelope]) -> None:
        """Replies another site just sent (checked by the HTTP door), straight to their callers."""
        await self._deliver_replies(None, [(b"", env) for env in replies])

    async def _deliver_replies(self, queue: str | None, replies: list[tuple[bytes, Envelope]]) -> None:
        """Hand replies to their callers; each request's first one wins. ``queue`` is where the items were
        popped from (they are acked), or None for replies that were not popped from a queue."""
        self._metrics.message("reply_received", len(replies))
        for _raw, env in replies:
            self._events.emit(ev.REPLY_RECEIVED, env, src=self._twin, dst=env.src)
        remembered = [self._open.get(env.uid) for _raw, env in replies]
        unknown = [
            keys.REQUEST_PREFIX + env.uid
            for (_raw, env), known in zip(replies, remembered, strict=True)
            if known is None
        ]
        loaded = iter(await self._store.load_entries(unknown) if unknown else [])
        outcomes: list[Outcome] = []
        lifetimes: list[float] = []
        for (raw, env), known in zip(replies, remembered, strict=True):
            entry = None if known is not None else next(loaded)[0]
            if known is None and entry is None:
                # The final-outcome script acks the item and delivers nothing: the request is finished.
                outcomes.append(Outcome(env.uid, env.ret or keys.REPLY, b"", raw))
                lifetimes.append(0.0)
                continue
            expected = destination_of(env.uid)
            if expected != env.src:
                reason = f"reply for uid {env.uid} came from twin {env.src}, not from twin {expected}"
                self._metrics.error("forged_reply")
                self._events.emit(ev.REJECTED, env, src=self._twin, dst=expected, error=reason)
                await self._set_aside(queue, raw, env, reason)
                log.error("dead-lettered reply: %s", reason, extra=about(uid=env.uid, src=env.src))
                continue
            if known is None:
                assert entry is not None
                try:
                    original = Envelope.decode(entry)
                except EnvelopeDecodeError as exc:
                    await self._store.forget_request(env.uid)
                    reason = f"backlog entry of {env.uid} unreadable: {exc.reason}"
                    await self._set_aside(queue, raw, env, reason)
                    continue
                known = (original.ret, original.lifetime_s)
            ret, lifetime_s = known
            outcomes.append(Outcome(env.uid, ret, env.replace(ret=ret).encode(), raw))
            lifetimes.append(lifetime_s)
        delivered = await self._store.finish_many(outcomes, ack_queue=queue)
        for outcome in outcomes:
            self._open.pop(outcome.uid, None)
        now = self._clock()
        for outcome, lifetime_s, deadline in zip(outcomes, lifetimes, delivered, strict=True):
            if deadline is not None:
                self._metrics.message("delivered_to_caller")
                if deadline > 0:
                    # The deadline was set to the acceptance time plus the lifetime.
                    self._metrics.observe_round_trip(max(0.0, now - (deadline - lifetime_s)))
                self._events.emit(
                    ev.DELIVERED,
                    uid=outcome.uid,
                    src=self._twin,
                    dst=destination_of(outcome.uid),
                    ret=outcome.ret,
                )
                log.debug(
                    "delivered reply uid=%s to %s",
                    outcome.uid,
                    outcome.ret,
                    extra=about(uid=outcome.uid, queue=outcome.ret),
                )
            else:
                log.info(
                    "dropped reply uid=%s: no open request (late or duplicate)",
                    outcome.uid,
                    extra=about(uid=outcome.uid),
                )

    async def _forward_replies(self, queue: str, replies: list[tuple[bytes, Envelope]]) -> None:
        """Queue services' replies for the twins that asked (sent by those twins' senders)."""
        now = self._clock()
        pending = []
        for raw, env in replies:
            self._events.emit(ev.REPLY_TAKEN, env, src=env.dst[0], dst=self._twin)
            key = keys.reply_key(env.dst[0], env.uid)
            state = {"first": now, "attempts": 0, "deadline": now + env.lifetime_s}
            pending.append(PendingReply(raw, env.dst[0], key, env.replace(sig="").encode(), state))
        results = await self._store.accept_replies(queue, pending)
        ready: dict[int, list[SendItem] | None] = {}
        for (_raw, env), item, result in zip(replies, pending, results, strict=True):
            if result == REPLY_KEY_TAKEN:
                self._metrics.message("dead_lettered")
                log.warning(
                    "dead-lettered a reply: %s",
                    already_waiting_text(item.key),
                    extra=about(uid=env.uid, dst=item.dst),
                )
                continue
            items = ready.setdefault(item.dst, []) if result == REPLY_QUEUED else None
            if items is None:
                ready[item.dst] = None
            else:
                items.append(self._items.reply(item.key, env.replace(sig=""), item.state))
        self._on_accepted(ready, set())
