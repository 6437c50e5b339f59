"""What the daemon does with one item of each system queue.

Each handler owns the item it is given: it either hands it off (removing it from the processing list in the
same transaction), or dead-letters it with a reason. An exception leaves the item in the processing list,
from where the next start of the daemon takes it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from msgbusd import keys
from msgbusd.envelope import Envelope, EnvelopeDecodeError
from msgbusd.errors import InvalidMessage
from msgbusd.outbox import Outbox, destination_of
from msgbusd.queues import Store
from msgbusd.validation import validate

log = logging.getLogger("msgbusd.handlers")


class Handlers:
    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        twin: int,
        on_accepted: Callable[[Iterable[int]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._twin = twin
        self._on_accepted = on_accepted
        self._clock = clock

    async def _decode(self, queue: str, raw: bytes) -> Envelope | None:
        try:
            return Envelope.decode(raw)
        except EnvelopeDecodeError as exc:
            await self._store.dead_letter(queue, raw, f"not an envelope: {exc.reason}")
            log.error("dead-lettered an undecodable item from %s: %s", queue, exc.reason)
            return None

    # --- msgbus.system.local: requests from local clients ------------------------------------------------

    async def local(self, raw: bytes) -> None:
        env = await self._decode(keys.LOCAL, raw)
        if env is None:
            return
        try:
            validate(env)
        except InvalidMessage as exc:
            await self._refuse_local(raw, env, exc)
            return
        now = self._clock()
        # A local client cannot ask for the proxy flow; honouring it would loop the reply back here.
        original = env.replace(now=int(now), src=self._twin, pxy=False, sig="")
        uids = await self._store.next_uids(env.dst)
        deadline = now + env.lifetime_s
        if await self._store.accept_request(
            raw, original.encode(), deadline, list(zip(uids, env.dst, strict=True))
        ):
            log.debug("accepted request cmd=%s ret=%s uids=%s", env.cmd, env.ret, ",".join(uids))
            self._on_accepted(env.dst)

    async def _refuse_local(self, raw: bytes, env: Envelope, exc: InvalidMessage) -> None:
        if not env.ret or keys.is_system_queue(env.ret):
            await self._store.dead_letter(keys.LOCAL, raw, exc.wire_text)
            log.error("dead-lettered local request cmd=%r without a usable return queue: %s", env.cmd, exc)
            return
        error = env.replace(err=exc.wire_text, src=self._twin, now=int(self._clock()))
        await self._store.hand_to_caller(keys.LOCAL, raw, env.ret, error.encode())
        log.info("refused local request cmd=%r ret=%s: %s", env.cmd, env.ret, exc.wire_text)

    # --- msgbus.system.remote: requests from other sites, to run here -------------------------------------

    async def remote(self, raw: bytes) -> None:
        env = await self._decode(keys.REMOTE, raw)
        if env is None:
            return
        try:
            validate(env, need_destination=not env.pxy)
        except InvalidMessage as exc:
            # The sender waits for an answer to this uid: send the error back as the reply.
            error = env.replace(
                src=self._twin, dst=(env.src,), err=exc.wire_text, dat="", now=int(self._clock())
            )
            log.info("refused request uid=%s from twin %s: %s", env.uid, env.src, exc.wire_text)
            await self._route_reply(keys.REMOTE, raw, error)
            return
        await self._store.hand_over(keys.REMOTE, raw, keys.command_queue(env.cmd), raw)
        log.debug("queued request uid=%s from twin %s for %s", env.uid, env.src, keys.command_queue(env.cmd))

    # --- msgbus.system.reply: replies from local services and from other sites ----------------------------

    async def reply(self, raw: bytes) -> None:
        env = await self._decode(keys.REPLY, raw)
        if env is not None:
            await self._route_reply(keys.REPLY, raw, env)

    async def _route_reply(self, queue: str, raw: bytes, env: Envelope) -> None:
        if env.pxy:
            await self._reply_to_proxy_client(queue, raw, env)
        elif not env.dst:
            await self._store.dead_letter(queue, raw, "reply has no destination twin")
        elif env.dst[0] == self._twin:
            await self._deliver_reply(queue, raw, env)
        elif env.src == self._twin:
            await self._forward_reply(queue, raw, env)
        else:
            reason = (
                f"reply from twin {env.src} to twin {env.dst[0]} does not concern this twin ({self._twin})"
            )
            await self._store.dead_letter(queue, raw, reason)
            log.error("dead-lettered reply uid=%s: %s", env.uid, reason)

    async def _reply_to_proxy_client(self, queue: str, raw: bytes, env: Envelope) -> None:
        if not env.ret or keys.is_system_queue(env.ret):
            await self._store.dead_letter(queue, raw, "proxy reply without a client return queue")
            log.error("dead-lettered proxy reply uid=%s: no client return queue", env.uid)
            return
        await self._store.hand_to_caller(queue, raw, env.ret, env.encode())
        log.debug("proxy reply uid=%s stored in %s", env.uid, env.ret)

    async def _deliver_reply(self, queue: str, raw: bytes, env: Envelope) -> None:
        entry = await self._store.backlog_entry(env.uid)
        if entry is None:
            await self._store.ack(queue, raw)
            log.info(
                "dropped reply uid=%s from twin %s: no open request (late or duplicate)", env.uid, env.src
            )
            return
        expected = destination_of(env.uid)
        if expected != env.src:
            reason = (
                f"reply for uid {env.uid} came from twin {env.src}, but the request went to twin {expected}"
            )
            await self._store.dead_letter(queue, raw, reason)
            log.error("dead-lettered reply: %s", reason)
            return
        try:
            original = Envelope.decode(entry)
        except EnvelopeDecodeError as exc:
            await self._store.forget_request(env.uid)
            await self._store.dead_letter(queue, raw, f"backlog entry of {env.uid} unreadable: {exc.reason}")
            return
        delivered = await self._store.finish(
            env.uid, original.ret, env.replace(ret=original.ret).encode(), ack=(queue, raw)
        )
        if delivered:
            log.debug("delivered reply uid=%s from twin %s to %s", env.uid, env.src, original.ret)
        else:
            log.info("dropped reply uid=%s from twin %s: request already finished", env.uid, env.src)

    async def _forward_reply(self, queue: str, raw: bytes, env: Envelope) -> None:
        now = self._clock()
        key = keys.reply_key(env.dst[0], env.uid)
        payload = env.replace(sig="")
        state = {"first": now, "attempts": 0, "deadline": now + env.lifetime_s}
        lease = self._outbox.lease_until()
        if await self._store.accept_reply(queue, raw, key, payload.encode(), state, lease):
            await self._outbox.attempt_reply(key, payload, state)
