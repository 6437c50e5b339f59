"""The site's HTTP door: ``/zbus-remote``, ``/zbus-reply``, ``/zbus-cmd`` and ``/zbus-result``.

Any method and any content type are accepted, as go-rmb does. The three signed endpoints run their checks in
the contract's order (JSON, freshness, source twin key, signature) and answer go-rmb's statuses and texts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from msgbusd.door import openapi
from msgbusd.door.rate_limit import TokenBuckets
from msgbusd.door.relaying import Relaying
from msgbusd.door.validation import validate
from msgbusd.errors import InvalidMessage, RejectedRequest
from msgbusd.identity.sealing import Sealer, SealError
from msgbusd.identity.signing import SignatureError, Signer, verify
from msgbusd.link.peer_clocks import PeerClocks
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import ErrorCause, Metrics
from msgbusd.sending.posts import BATCH_PATH, REMOTE_PATH, REPLY_PATH, SENDER_LINKS_HEADER
from msgbusd.store.queues import Inbound, Store
from twin_resolver.base import Resolver, ResolverError, Twin, TwinNotFound
from wire import event_schema as ev
from wire import keys
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES, Envelope, EnvelopeDecodeError
from wire.error_texts import go_duration, http_error_body, is_too_old_text, too_large_text, too_old_text

# A request is remembered as seen for at most this long (its lifetime plus the freshness window otherwise).
MAX_DEDUP_TTL_S = 366 * 24 * 3600
# Default limit on a message (go-rmb has none): large enough for any RMB payload in use.

log = logging.getLogger("msgbusd.http")

# What a peer is told to wait before sending again when this site's Redis cannot take its message.
REDIS_RETRY_AFTER_S = 1

ACCEPTED_BODY = b'{"status": "accepted"}'
JSON_TYPE = "application/json"
JSON_TYPE_BYTES = JSON_TYPE.encode()
CMD_PATH = "/zbus-cmd"
SENDER_LINKS_HEADER_BYTES = SENDER_LINKS_HEADER.encode()
RESULT_PATH = "/zbus-result"

# An endpoint's answer to a request POSTed to it: the status and the body (JSON).
Answer = tuple[int, bytes]
# Called with the path, the body, and whether the sender has links (it sends again over one what is refused
# for its clock).
Handler = Callable[[str, bytes, bool], Awaitable[Answer]]
ACCEPTED: Answer = (200, ACCEPTED_BODY)


@dataclass
class Door:
    """What the endpoints need: the site's Redis, its resolver and key, and a clock.

    With ``twin`` and ``deliver_replies`` set (the daemon sets them), replies for this twin go straight to
    their callers; requests always go straight to their service's list once checked and valid.
    """

    store: Store
    resolver: Resolver
    signer: Signer
    freshness_s: float = 60.0
    clock: Callable[[], float] = time.time
    metrics: Metrics = field(default_factory=Metrics)
    twin: int = 0
    deliver_replies: Callable[[list[Envelope]], Awaitable[None]] | None = None
    events: EventLog = field(default_factory=lambda: EventLog(None, 0))
    # A body larger than this is refused (413) before it is read.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Per source twin, after its signature is checked; None: no limit.
    rate_limit: TokenBuckets | None = None
    # --relay: messages for the twins this site relays are kept for them (None: not a relay).
    relaying: Relaying | None = None
    # Decrypts what comes through this site's relay (None: nothing does).
    sealer: Sealer | None = None
    # The peers' clocks: a message from a twin whose clock a link measured is judged on that clock.
    clocks: PeerClocks = field(default_factory=PeerClocks)

    async def verified(self, path: str, body: bytes, *, sender_links: bool = False) -> Envelope:
        """The envelope POSTed to ``path``, if it passes every check; else :class:`RejectedRequest`.
        ``sender_links``: the sender sends again over a link what is refused for its clock."""
        try:
            env = Envelope.decode(body)
        except EnvelopeDecodeError as exc:
            raise self._rejected("invalid", 400, "couldn't parse json") from exc
        await self._check_or_tell(path, env, tell_caller=not sender_links)
        if path != CMD_PATH:
            self.refuse_proxied(env)
            await self._check_relayed(env)
        return env

    def _relays(self, env: Envelope) -> bool:
        """``env`` is for another twin, which this site relays."""
        return self.relaying is not None and bool(env.dst) and env.dst[0] != self.twin

    async def _check_relayed(self, env: Envelope) -> None:
        if self._relays(env):
            assert self.relaying is not None
            try:
                await self.relaying.check(env)
            except RejectedRequest as exc:
                raise self._rejected("invalid", exc.status, exc.message, env) from exc

    def refuse_proxied(self, env: Envelope) -> None:
        """Site to site, nothing is ``pxy``: the proxy flow starts at ``/zbus-cmd`` and its replies stay on
        the site that ran the request. A ``pxy`` reply from a peer would go to whatever list it names."""
        if env.pxy:
            raise self._rejected("invalid", 400, "pxy messages are only taken on /zbus-cmd", env)

    def _rejected(
        self, cause: ErrorCause, status: int, message: str, env: Envelope | None = None
    ) -> RejectedRequest:
        """Count a refused message and record it; returns the error to raise."""
        self.metrics.message("rejected")
        self.metrics.error(cause)
        self.events.emit(ev.REJECTED, env, status=status, error=message)
        return RejectedRequest(status, message)

    async def _check_or_tell(
        self, path: str, env: Envelope, *, through_relay: bool = False, tell_caller: bool = True
    ) -> Twin:
        """:meth:`check`; with ``tell_caller``, a reply refused as too old because its site's clock is off
        is told to its caller."""
        try:
            return await self.check(env, through_relay=through_relay)
        except RejectedRequest as exc:
            if tell_caller and path == REPLY_PATH and is_too_old_text(exc.message):
                await self._tell_caller_of_stale_reply(env, exc.message)
            raise

    async def _tell_caller_of_stale_reply(self, env: Envelope, refusal: str) -> None:
        """A reply is refused as too old (go-rmb's 60 s rule, for a site without a link), and its site's clock
        is known to be off: its caller is told why at once, instead of waiting out the request's lifetime
        for a reply that this site refuses every time. Only a reply signed by its twin does so."""
        clock = self.clocks.explain(env.src)
        if not clock or not self._for_our_callers(env) or self.deliver_replies is None:
            return
        try:
            verify(env, (await self.resolver.get_twin(env.src)).public_key)
        except (ResolverError, SignatureError):
            return
        err = f"twin {env.src}'s reply was refused: {refusal}: {clock}"
        log.warning("%s", err, extra=about(uid=env.uid, src=env.src))
        await self.deliver_replies([env.replace(err=err, dat="", sig="")])

    async def check(self, env: Envelope, *, through_relay: bool = False) -> Twin:
        """Freshness, the source twin's key and the signature, in go-rmb's order; returns the source twin.
        What came through a relay may have waited there for the destination: it is fresh for its lifetime.
        A message from a twin whose clock a link measured is fresh if it is on that twin's clock too."""
        now = int(self.clock())
        freshness_s = self.freshness_s + (env.lifetime_s if through_relay else 0)
        if now - env.now > freshness_s and not self.clocks.fresh_on_senders_clock(
            env.src, env.now, self.clock(), freshness_s
        ):
            age = go_duration(self.clock() - env.now)
            message = too_old_text(age, env.now, now)
            raise self._rejected("too_old", 400, message, env)
        try:
            twin = await self.resolver.get_twin(env.src)
        except TwinNotFound as exc:
            raise self._rejected("not_found", 400, f"source twin {env.src} not found", env) from exc
        except ResolverError as exc:
            message = f"couldn't get twin {env.src} public key: {exc}"
            raise self._rejected("other", 502, message, env) from exc
        try:
            verify(env, twin.public_key)
        except SignatureError as exc:
            raise self._rejected("signature", 400, exc.message, env) from exc
        self.clocks.signed_stamp(env.src, env.now, now)
        if self.rate_limit is not None and not self.rate_limit.allow(env.src):
            message = (
                f"too many messages from twin {env.src}: the limit is {self.rate_limit.rate:g} per second"
            )
            raise self._rejected("rate_limited", 429, message, env)
        return twin

    def too_large(self) -> RejectedRequest:
        """The error for a body over :attr:`max_message_bytes` (counted and recorded)."""
        return self._rejected("too_large", 413, too_large_text(self.max_message_bytes))

    async def take(self, messages: list[tuple[str, Envelope]]) -> None:
        """Hand on checked envelopes that came in on ``/zbus-remote`` or ``/zbus-reply``: valid requests to
        their service's list (once per lifetime), replies for this twin to their callers, anything else to
        the daemon's queues (which answer invalid requests with an error)."""
        if self.relaying is not None:
            relayed = [(path == REMOTE_PATH, env) for path, env in messages if self._relays(env)]
            if relayed:
                await self.relaying.take(relayed)
                messages = [(path, env) for path, env in messages if not self._relays(env)]
        replies = [env for path, env in messages if path == REPLY_PATH and self._for_our_callers(env)]
        items = [
            self._inbound(path, env)
            for path, env in messages
            if not (path == REPLY_PATH and self._for_our_callers(env))
        ]
        self.metrics.message("received", len(messages))
        for path, env in messages:
            if path == REMOTE_PATH:
                self.events.emit(ev.RECEIVED, env)
        if items:
            queued = await self.store.queue_from_peers(items)
            self._record_hand_overs(items, queued)
            duplicates = len(queued) - sum(queued)
            if duplicates:
                self.metrics.message("duplicate", duplicates)
                log.info(
                    "%d request(s) re-sent by a twin were already accepted; not queued again", duplicates
                )
        if replies and self.deliver_replies is not None:
            await self.deliver_replies(replies)

    async def answer(
        self,
        messages: list[object],
        peer: int | None = None,
        *,
        relay: int | None = None,
        sender_links: bool = False,
    ) -> list[dict[str, object]]:
        """Check and take ``{"path", "envelope"}`` messages that came together; one answer per message,
        in order (``{"status": 200}`` or the status and go-rmb's text). ``peer``: the twin at the other end
        of a link, the only source taken from it. ``relay``: they came from this site's relay (that twin),
        from any twin; the payloads of the others' are decrypted. ``sender_links``: they were POSTed by a
        site that sends again over a link what is refused for its clock."""
        results: list[dict[str, object]] = [{"status": 200} for _ in messages]
        accepted: list[tuple[str, Envelope]] = []
        # Requests through the relay whose payload does not decrypt: their callers get the error as a reply.
        unreadable: list[Inbound] = []
        for index, message in enumerate(messages):
            try:
                path, env = batch_item(message)
                if peer is not None and env.src != peer:
                    message = f"this link carries twin {peer}'s messages only"
                    raise self._rejected("invalid", 400, message, env)
                through_relay = relay is not None and env.src != relay
                source = await self._check_or_tell(
                    path, env, through_relay=through_relay, tell_caller=not sender_links
                )
                self.refuse_proxied(env)
                if through_relay:
                    try:
                        env = self._opened(env, source)
                    except SealError as exc:
                        if path != REMOTE_PATH:
                            raise self._rejected("invalid", 400, str(exc), env) from exc
                        unreadable.append(self._unreadable(env, str(exc)))
                        continue
                else:
                    await self._check_relayed(env)
            except RejectedRequest as exc:
                results[index] = {"status": exc.status, "message": exc.message}
                continue
            accepted.append((path, env))
        await self.take(accepted)
        if unreadable:
            await self.store.queue_from_peers(unreadable)
        return results

    def _opened(self, env: Envelope, source: Twin) -> Envelope:
        """A message that came through this site's relay, for this twin, with its payload decrypted; raises
        :class:`SealError` when it does not decrypt."""
        if not env.dst or env.dst[0] != self.twin:
            message = f"the relay sent a message for {f'twin {env.dst[0]}' if env.dst else 'no twin'}"
            raise self._rejected("invalid", 400, message, env)
        if self.sealer is None:
            raise self._rejected("invalid", 400, "this site takes no messages through a relay", env)
        return self.sealer.open(env, source)

    def _unreadable(self, env: Envelope, reason: str) -> Inbound:
        """The error reply to a request whose payload this site cannot decrypt (it came through the relay,
        which would send it again and again): taken like a service's reply, so its caller reads why."""
        self.metrics.error("invalid")
        self.events.emit(ev.REJECTED, env, status=400, error=reason)
        log.warning(
            "request uid=%s from twin %s came through the relay unreadable: %s", env.uid, env.src, reason
        )
        error = env.replace(src=self.twin, dst=(env.src,), err=reason, dat="", now=int(self.clock()), sig="")
        return Inbound(keys.REPLY, error.encode())

    def _record_hand_overs(self, items: list[Inbound], queued: list[bool]) -> None:
        if not self.events.enabled:
            return
        for item, done in zip(items, queued, strict=True):
            if item.to_service and item.envelope is not None:
                event = ev.HANDED_TO_SERVICE if done else ev.DUPLICATE
                self.events.emit(event, item.envelope, queue=item.queue)

    def _for_our_callers(self, env: Envelope) -> bool:
        return self.deliver_replies is not None and not env.pxy and bool(env.dst) and env.dst[0] == self.twin

    def _inbound(self, path: str, env: Envelope) -> Inbound:
        if path == REPLY_PATH:
            return Inbound(keys.REPLY, env.encode())
        try:
            validate(env)
        except InvalidMessage:
            return Inbound(keys.REMOTE, env.encode())
        target = keys.command_queue(env.cmd)
        if not env.uid:
            return Inbound(target, env.encode(), to_service=True, envelope=env)
        ttl_s = dedup_ttl_s(env, self.freshness_s)
        return Inbound(target, env.encode(), env.src, seen_id(env), ttl_s, to_service=True, envelope=env)


def create_app(door: Door, extra_routes: Sequence[BaseRoute] = ()) -> DoorApp:
    """The site port's app: the RMB endpoints and ``/zbus-batch`` (``/zbus-link`` is served on the
    connection itself, not by an app: :mod:`msgbusd.link.site_socket`).

    The endpoints peers POST to are plain ASGI apps reached by their path alone, ahead of starlette's
    routing and middleware: every message a go-rmb peer sends, and every single message between msgbus
    sites, comes in one of them."""

    async def remote(path: str, body: bytes, sender_links: bool) -> Answer:
        await door.take([(REMOTE_PATH, await door.verified(path, body, sender_links=sender_links))])
        return ACCEPTED

    async def reply(path: str, body: bytes, sender_links: bool) -> Answer:
        await door.take([(REPLY_PATH, await door.verified(path, body, sender_links=sender_links))])
        return ACCEPTED

    async def batch(path: str, body: bytes, sender_links: bool) -> Answer:
        return 200, await take_batch(door, body, sender_links=sender_links)

    async def cmd(path: str, body: bytes, sender_links: bool) -> Answer:
        env = await door.verified(path, body)
        retqueue = str(uuid.uuid4())
        await door.store.push(keys.REMOTE, env.replace(pxy=True, ret=retqueue).encode())
        return 200, json.dumps({"retqueue": retqueue}).encode()

    async def result(path: str, body: bytes, sender_links: bool) -> Answer:
        retqueue = _retqueue(body)
        now = int(door.clock())
        items = []
        for raw in await door.store.read_list(retqueue):
            try:
                env = Envelope.decode(raw)
            except EnvelopeDecodeError as exc:
                log.error("skipped an undecodable item in %s: %s", retqueue, exc.reason)
                continue
            shown = env.replace(dat=_payload_text(env.dat), now=now)
            items.append(door.signer.sign(shown).to_wire())
        return 200, json.dumps(items).encode()

    endpoints = {
        REMOTE_PATH: remote,
        REPLY_PATH: reply,
        CMD_PATH: cmd,
        RESULT_PATH: result,
        BATCH_PATH: batch,
    }
    routes = [Route("/openapi.json", openapi_endpoint, methods=["GET"]), *extra_routes]
    by_path = {path: _Endpoint(handler, door) for path, handler in endpoints.items()}
    return DoorApp(by_path, Starlette(routes=routes))


class DoorApp:
    """The RMB endpoints by their path, any method; everything else to starlette's routes."""

    def __init__(self, endpoints: dict[str, _Endpoint], others: Starlette) -> None:
        self._endpoints = endpoints
        self._others = others

    def paths(self) -> set[str]:
        """Every path served."""
        return self._endpoints.keys() | {getattr(route, "path", "") for route in self._others.routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self._others(scope, receive, send)
        else:
            await endpoint(scope, receive, send)


async def openapi_endpoint(request: Request) -> Response:
    return Response(json.dumps(openapi.document()), 200, media_type=JSON_TYPE)


def loopback_only(app: ASGIApp) -> ASGIApp:
    """Serve ``app`` to clients on this machine only: the site port is public, operations data is not."""
    return _LoopbackOnly(app)


class _LoopbackOnly:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if client and _is_loopback(client[0]):
            await self._app(scope, receive, send)
            return
        body = http_error_body("only served to clients on this machine")
        await Response(body, 403, media_type=JSON_TYPE)(scope, receive, send)


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # On a dual-stack socket an IPv4 client shows up as ::ffff:127.0.0.1.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


async def take_batch(door: Door, body: bytes, *, sender_links: bool = False) -> bytes:
    """``/zbus-batch``, between msgbus sites: many envelopes in one POST, each checked and answered alone.

    Body ``{"messages": [{"path": "/zbus-remote" | "/zbus-reply", "envelope": {...}}, ...]}``; answer
    ``{"results": [{"status": 200} | {"status": 400, "message": "..."}, ...]}`` in the same order.
    """
    try:
        messages = json.loads(body)["messages"]
        if not isinstance(messages, list):
            raise TypeError("messages is not a list")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc
    return json.dumps({"results": await door.answer(messages, sender_links=sender_links)}).encode()


async def answer_link_frame(
    door: Door, peer: int, messages: list[object], *, through_relay: bool = False
) -> list[dict[str, object]]:
    """The answers to a frame of envelopes that came over a link from twin ``peer``: as for a batch, and
    only envelopes from ``peer`` are taken (a site speaks for itself on its links), unless the link is this
    site's link to its relay (``through_relay``), which brings other twins' messages. When Redis cannot take
    them, every envelope is answered 503 with ``retry_after``: the peer sends them again then."""
    try:
        if through_relay:
            return await door.answer(messages, relay=peer)
        return await door.answer(messages, peer)
    except RedisError as exc:
        log.error("redis failed while taking a frame from twin %s: %s", peer, exc)
        door.metrics.error("redis")
        message = f"couldn't queue the message, the site's redis failed: {exc}"
        return [{"status": 503, "message": message, "retry_after": REDIS_RETRY_AFTER_S} for _ in messages]


def batch_item(message: object) -> tuple[str, Envelope]:
    """One message of a batch or a link frame (``{"path", "envelope"}``): its path and envelope; go-rmb's
    400 for anything else."""
    if not isinstance(message, dict) or message.get("path") not in (REMOTE_PATH, REPLY_PATH):
        raise RejectedRequest(400, "couldn't parse json")
    try:
        return str(message["path"]), Envelope.from_wire(message.get("envelope"))
    except EnvelopeDecodeError as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc


def seen_id(env: Envelope) -> str:
    """What identifies one request from a twin: its uid, and a digest of its command and payload."""
    digest = hashlib.md5(f"{env.cmd}\n{env.dat}".encode(), usedforsecurity=False).hexdigest()[:16]
    return f"{env.uid}.{digest}"


def dedup_ttl_s(env: Envelope, freshness_s: float) -> int:
    """How long a re-send of ``env`` may still arrive: the sender re-sends it until its lifetime ends (capped,
    so that an absurd ``exp`` cannot put the key's expiry out of Redis's range)."""
    return min(env.lifetime_s + int(freshness_s), MAX_DEDUP_TTL_S)


class _Endpoint:
    """One RMB endpoint as a plain ASGI app: reads the body (refusing one over the door's limit with 413, at
    once when its Content-Length says so), runs ``handler`` and answers, with go-rmb's statuses and texts
    for refusals and a 503 with Retry-After when Redis cannot take the message."""

    def __init__(self, handler: Handler, door: Door) -> None:
        self._handler = handler
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        headers: list[tuple[bytes, bytes]] = []
        try:
            body = await self._body(scope, receive)
            if body is None:
                return
            status, answer = await self._handler(path, body, _sender_links(scope))
        except RejectedRequest as exc:
            log.info("refused %s %s: %s", scope["method"], path, exc.message)
            status, answer = exc.status, http_error_body(exc.message)
        except RedisError as exc:
            # The sender keeps the message and sends it again after Retry-After, without spending a try.
            log.error("redis failed while handling %s: %s", path, exc)
            self._door.metrics.error("redis")
            status = 503
            answer = http_error_body(f"couldn't queue the message, the site's redis failed: {exc}")
            headers.append((b"retry-after", str(REDIS_RETRY_AFTER_S).encode()))
        headers += [(b"content-length", str(len(answer)).encode()), (b"content-type", JSON_TYPE_BYTES)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    async def _body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request's body; None if the client went away first."""
        limit = self._door.max_message_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise self._door.too_large()
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise self._door.too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _sender_links(scope: Scope) -> bool:
    return any(name == SENDER_LINKS_HEADER_BYTES for name, _value in scope["headers"])


def _retqueue(body: bytes) -> str:
    try:
        value = json.loads(body)["retqueue"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc
    if not isinstance(value, str):
        raise RejectedRequest(400, "couldn't parse json")
    try:
        parsed = uuid.UUID(value)
    except ValueError as exc:
        raise RejectedRequest(400, "Invalid Retqueue, it should be a valid UUID") from exc
    if parsed.version != 4:
        raise RejectedRequest(400, "Invalid Retqueue, it should be a valid UUID")
    return value


def _payload_text(dat: str) -> str:
    try:
        return base64.b64decode(dat, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return dat
