"""The twins' endpoints: go-rmb's checks and answers for every up twin's ``/zbus-remote`` and
``/zbus-reply`` POSTs and ``/zbus-link`` links, and ``/stats``; the replies, signed as their twin, on their
way back to the sites (on the link a request came on, else by POST). A twin's end of a link
(:class:`TwinLink`) lives here beside :class:`ManyTwins`, as each of the two uses the other."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from msgbusd.door.http_api import batch_item
from msgbusd.door.validation import validate
from msgbusd.errors import DeliveryError, InvalidMessage, RejectedRequest
from msgbusd.identity.signing import SignatureError, Signer, verify, verify_digest
from msgbusd.link.handshake import handshake_digest
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_sockets import REFUSED, LinkClosed
from msgbusd.link.open_link import Link, send_envelopes
from msgbusd.sending.posts import REMOTE_PATH, REPLY_PATH, PostClient
from testing.many_twins.counts import Counts
from testing.many_twins.link import LinkSocket
from testing.many_twins.twins import TwinRange
from twin_resolver.base import Resolver, ResolverError, TwinNotFound
from wire.envelope import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Envelope,
    EnvelopeDecodeError,
    encode_payload,
    envelope_size_limit,
)
from wire.error_texts import go_duration, http_error_body

log = logging.getLogger("testing.many_twins")

ACCEPTED_BODY = b'{"status": "accepted"}'
JSON_TYPE = "application/json"
# Replies sent in one frame on a link at most.
LINK_BATCH = 64
MAX_FRAME_BYTES = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES)


@dataclass(frozen=True)
class Settings:
    """What the command line sets."""

    twins: TwinRange
    twins_file: Path
    # 0: any free port (the twin file says which).
    port: int = 0
    down_port: int = 0
    links: bool = True
    # Reply with this many bytes instead of the request's payload.
    reply_bytes: int | None = None
    freshness_s: float = 60.0
    timeout_s: float = 10.0
    # Concurrent reply POSTs, and tries of each (a site that does not answer, or answers 5xx or 429).
    reply_workers: int = 64
    reply_tries: int = 3
    reply_retry_delay_s: float = 0.2


@dataclass(frozen=True)
class PendingReply:
    twin: int
    envelope: Envelope


class ManyTwins:
    """The endpoints of every up twin of the range, and the replies on their way to the sites."""

    def __init__(
        self,
        settings: Settings,
        signers: Mapping[int, Signer],
        resolver: Resolver,
        http: HttpClients,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.counts = Counts()
        self._signers = {twin: signers[twin] for twin in settings.twins.up_ids}
        self._resolver = resolver
        self._posts = PostClient(http, resolver, max_batch_bytes=MAX_FRAME_BYTES)
        self._clock = clock
        self._outbox: asyncio.Queue[PendingReply] = asyncio.Queue()
        self._links: set[TwinLink] = set()
        size = settings.reply_bytes
        self._reply_dat = None if size is None else encode_payload(b"r" * size)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_FRAME_BYTES)
        twin = r"/t/{twin:\d+}"
        app.router.add_route(
            "*", twin + REMOTE_PATH, functools.partial(self._signed_endpoint, path=REMOTE_PATH)
        )
        app.router.add_route(
            "*", twin + REPLY_PATH, functools.partial(self._signed_endpoint, path=REPLY_PATH)
        )
        app.router.add_route("*", twin + "/zbus-link", self._link)
        app.router.add_get("/stats", self._stats)
        # A site that cannot reach a path under an address (go-rmb) reaches the twin at its address alone.
        for path in (REMOTE_PATH, REPLY_PATH):
            app.router.add_route("*", path, functools.partial(self._signed_endpoint, path=path))
        return app

    def stats(self, *, per_twin: bool = False) -> dict[str, Any]:
        links_open = sum(link.is_open for link in self._links)
        return self.counts.as_json(self.settings.twins, links_open, per_twin=per_twin)

    async def check(self, env: Envelope) -> None:
        """go-rmb's checks after the JSON, in its order; raises :class:`RejectedRequest` with its answer."""
        now = int(self._clock())
        if now - env.now > self.settings.freshness_s:
            age = go_duration(self._clock() - env.now)
            raise RejectedRequest(
                400, f"message is too old, sent since {age}, sent time: {env.now}, now: {now}"
            )
        try:
            source = await self._resolver.get_twin(env.src)
        except TwinNotFound as exc:
            raise RejectedRequest(400, f"source twin {env.src} not found") from exc
        except ResolverError as exc:
            raise RejectedRequest(502, f"couldn't get twin {env.src} public key: {exc}") from exc
        try:
            verify(env, source.public_key)
        except SignatureError as exc:
            raise RejectedRequest(400, exc.message) from exc

    def take(self, twin: int, path: str, env: Envelope, way: str) -> PendingReply | None:
        """Count a checked envelope that came to ``twin``; the reply to send if it is a request."""
        if path != REMOTE_PATH:
            self.counts.replies_received += 1
            return None
        self.counts.took(twin, env.src, env.uid, way)
        return PendingReply(twin, self._reply_to(twin, env))

    def _reply_to(self, twin: int, request: Envelope) -> Envelope:
        """What a service of ``twin`` answers (unsigned); an invalid request gets go-rmb's error instead."""
        reply = request.replace(src=twin, dst=(request.src,), err="", sig="")
        try:
            validate(request)
        except InvalidMessage as exc:
            return reply.replace(dat="", err=exc.wire_text)
        return reply if self._reply_dat is None else reply.replace(dat=self._reply_dat)

    def signed(self, reply: PendingReply) -> bytes:
        """``reply`` as it goes on the wire now: stamped, signed by its twin, encoded."""
        return self._signers[reply.twin].sign(reply.envelope.replace(now=int(self._clock()))).encode()

    def answered(self, reply: PendingReply, way: str) -> None:
        self.counts.replies[way] += 1
        self.counts.answered[reply.twin] += 1

    def failed(self, reply: PendingReply, cause: str) -> None:
        self.counts.replies_failed += 1
        log.warning("reply uid=%s of twin %s lost: %s", reply.envelope.uid, reply.twin, cause)

    def post_later(self, reply: PendingReply) -> None:
        self._outbox.put_nowait(reply)

    async def post_replies(self) -> None:
        """One of the reply senders: POST replies to their sites' ``/zbus-reply``, one after the other."""
        while True:
            reply = await self._outbox.get()
            try:
                await self._post(reply)
            except Exception as exc:
                # A sender that stopped would leave the replies behind it unsent.
                log.exception("reply uid=%s of twin %s failed", reply.envelope.uid, reply.twin)
                self.failed(reply, str(exc))
            finally:
                self._outbox.task_done()

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the replies still to POST."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outbox.join(), timeout_s)

    async def close_links(self) -> None:
        await asyncio.gather(*(link.close() for link in list(self._links)))

    async def _post(self, reply: PendingReply) -> None:
        site = reply.envelope.dst[0]
        for attempt in range(1, self.settings.reply_tries + 1):
            try:
                await self._posts.send(site, REPLY_PATH, self.signed(reply))
            except DeliveryError as exc:
                again = exc.offline or exc.retry_after_s is not None
                if not again or attempt == self.settings.reply_tries:
                    self.failed(reply, exc.cause)
                    return
                await asyncio.sleep(self.settings.reply_retry_delay_s * 2 ** (attempt - 1))
            else:
                self.answered(reply, "post")
                return

    def _twin_of(self, request: web.Request) -> int:
        if "twin" in request.match_info:
            twin: int | None = int(request.match_info["twin"])
        else:
            sockname = request.transport.get_extra_info("sockname") if request.transport else None
            twin = self.settings.twins.twin_at(sockname[0]) if sockname else None
        if twin is None or twin not in self._signers:
            raise web.HTTPNotFound(
                text=http_error_body(f"twin {twin} is not served here").decode(), content_type=JSON_TYPE
            )
        return twin

    async def _signed_endpoint(self, request: web.Request, path: str) -> web.Response:
        twin = self._twin_of(request)
        try:
            env = _decoded(await request.read())
            await self.check(env)
        except RejectedRequest as exc:
            self.counts.refused += 1
            log.info("refused %s %s: %s", request.method, request.path, exc.message)
            return web.Response(body=http_error_body(exc.message), status=exc.status, content_type=JSON_TYPE)
        pending = self.take(twin, path, env, "post")
        if pending is not None:
            self.post_later(pending)
        return web.Response(body=ACCEPTED_BODY, content_type=JSON_TYPE)

    async def _link(self, request: web.Request) -> web.StreamResponse:
        twin = self._twin_of(request)
        if not self.settings.links:
            return web.Response(status=404, text="404 page not found")
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES + 4096, compress=False)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="expected a WebSocket upgrade")
        await ws.prepare(request)
        sock = LinkSocket(ws)
        try:
            site, site_max_bytes = await asyncio.wait_for(self._greet(sock, twin), self.settings.timeout_s)
        except (TimeoutError, _Refused) as exc:
            self.counts.links_refused += 1
            reason = str(exc) if isinstance(exc, _Refused) else "no handshake in time"
            log.info("twin %s refused a link: %s", twin, reason)
            await sock.close(REFUSED, reason)
            return ws
        except LinkClosed:
            return ws
        self.counts.links_opened += 1
        link = TwinLink(self, twin, site, sock, site_max_bytes)
        self._links.add(link)
        try:
            await link.run()
        finally:
            self._links.discard(link)
        return ws

    async def _greet(self, sock: LinkSocket, twin: int) -> tuple[int, int]:
        """The site's half of a link's handshake, as ``twin`` (see
        :class:`msgbusd.link.handshake.Handshakes`): the opener's twin, once it proved it holds that twin's
        key, and the largest envelope it takes."""
        nonce = os.urandom(16).hex()
        challenge = {"op": "challenge", "twin": twin, "nonce": nonce, "max_bytes": MAX_FRAME_BYTES}
        await sock.send(json.dumps(challenge).encode())
        try:
            hello = json.loads(await sock.receive() or b"null")
            if not isinstance(hello, dict) or hello.get("op") != "hello":
                raise ValueError("expected hello")
            site = int(hello["twin"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _Refused(f"no valid hello: {exc}") from exc
        try:
            key = (await self._resolver.get_twin(site)).public_key
        except ResolverError as exc:
            raise _Refused(f"couldn't get twin {site} public key: {exc}") from exc
        try:
            verify_digest(str(hello.get("sig", "")), handshake_digest(site, twin, nonce), key)
        except SignatureError as exc:
            raise _Refused(f"not signed by twin {site}: {exc.message}") from exc
        sig = self._signers[twin].sign_digest(handshake_digest(twin, site, str(hello.get("nonce", ""))))
        await sock.send(json.dumps({"op": "welcome", "sig": sig.hex()}).encode())
        max_bytes = hello.get("max_bytes")
        return site, max_bytes if isinstance(max_bytes, int) and max_bytes > 0 else MAX_FRAME_BYTES

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats(per_twin=request.query.get("per_twin") == "1"))


class TwinLink:
    """A link a site opened to one twin: its requests come in ``send`` frames, the replies go back on it."""

    def __init__(
        self, harness: ManyTwins, twin: int, site: int, sock: LinkSocket, site_max_bytes: int
    ) -> None:
        self._harness = harness
        self._twin = twin
        self._link = Link(site, sock, self._answer, opened_here=False, peer_max_bytes=site_max_bytes)
        # None: the link is closed, what is left goes by POST.
        self._replies: asyncio.Queue[PendingReply | None] = asyncio.Queue()

    @property
    def is_open(self) -> bool:
        return self._link.is_open

    async def run(self) -> None:
        """Serve the link until it closes; replies that did not get through on it are POSTed."""
        sender = asyncio.ensure_future(self._send_replies())
        try:
            await self._link.run()
        finally:
            self._replies.put_nowait(None)
            await sender

    async def close(self) -> None:
        await self._link.close("the twins are stopping", code=1001)

    async def _answer(self, site: int, messages: list[Any], _through_relay: bool) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for message in messages:
            try:
                path, env = batch_item(message)
                if env.src != site:
                    raise RejectedRequest(400, f"this link carries twin {site}'s messages only")
                await self._harness.check(env)
            except RejectedRequest as exc:
                self._harness.counts.refused += 1
                results.append({"status": exc.status, "message": exc.message})
                continue
            results.append({"status": 200})
            pending = self._harness.take(self._twin, path, env, "link")
            if pending is not None:
                self._replies.put_nowait(pending)
        return results

    async def _send_replies(self) -> None:
        closing = False
        while not closing:
            batch: list[PendingReply] = []
            reply = await self._replies.get()
            while reply is not None:
                batch.append(reply)
                if len(batch) == LINK_BATCH or self._replies.empty():
                    break
                reply = self._replies.get_nowait()
            closing = reply is None
            await self._deliver(batch)

    async def _deliver(self, batch: list[PendingReply]) -> None:
        harness = self._harness
        if not batch:
            return
        if not self._link.is_open:
            for reply in batch:
                harness.post_later(reply)
            return
        signed = [(REPLY_PATH, harness.signed(reply)) for reply in batch]
        results = await send_envelopes(self._link, signed, harness.settings.timeout_s)
        for reply, error in zip(batch, results, strict=True):
            if error is None:
                harness.answered(reply, "link")
            elif error.offline:
                # The link broke before the site answered: it may or may not have the reply; send it again.
                harness.post_later(reply)
            else:
                harness.failed(reply, error.cause)


class _Refused(Exception):
    """A link handshake refused; the message is the close reason."""


def _decoded(body: bytes) -> Envelope:
    try:
        return Envelope.decode(body)
    except EnvelopeDecodeError as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc
