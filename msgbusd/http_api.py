"""The site's HTTP door: ``/zbus-remote``, ``/zbus-reply``, ``/zbus-cmd`` and ``/zbus-result``.

Any method and any content type are accepted, as go-rmb does. The three signed endpoints run their checks in
the contract's order (JSON, freshness, source twin key, signature) and answer go-rmb's statuses and texts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from msgbusd import keys
from msgbusd.envelope import Envelope, EnvelopeDecodeError
from msgbusd.errors import RejectedRequest, go_duration, http_error_body
from msgbusd.queues import Store
from msgbusd.signing import SignatureError, Signer, verify
from twin_resolver.base import Resolver, ResolverError, TwinNotFound

log = logging.getLogger("msgbusd.http")

ACCEPTED_BODY = b'{"status": "accepted"}'
JSON_TYPE = "application/json"


@dataclass(frozen=True)
class Door:
    """What the endpoints need: the site's Redis, its resolver and key, and a clock."""

    store: Store
    resolver: Resolver
    signer: Signer
    freshness_s: float = 60.0
    clock: Callable[[], float] = time.time

    async def verified(self, request: Request) -> Envelope:
        """The request's envelope, if it passes every check; else :class:`RejectedRequest`."""
        body = await request.body()
        try:
            env = Envelope.decode(body)
        except EnvelopeDecodeError as exc:
            raise RejectedRequest(400, "couldn't parse json") from exc
        now = int(self.clock())
        if now - env.now > self.freshness_s:
            age = go_duration(self.clock() - env.now)
            raise RejectedRequest(
                400, f"message is too old, sent since {age}, sent time: {env.now}, now: {now}"
            )
        try:
            twin = await self.resolver.get_twin(env.src)
        except TwinNotFound as exc:
            raise RejectedRequest(400, f"source twin {env.src} not found") from exc
        except ResolverError as exc:
            raise RejectedRequest(502, f"couldn't get twin {env.src} public key: {exc}") from exc
        try:
            verify(env, twin.public_key)
        except SignatureError as exc:
            raise RejectedRequest(400, exc.message) from exc
        return env


def create_app(door: Door) -> Starlette:
    async def remote(request: Request) -> Response:
        env = await door.verified(request)
        if not env.uid:
            await door.store.push(keys.REMOTE, env.encode())
        elif not await door.store.accept_remote(
            env.src, seen_id(env), dedup_ttl_s(env, door.freshness_s), env.encode()
        ):
            log.info("request uid=%s from twin %s was already accepted; not queued again", env.uid, env.src)
        return _accepted()

    async def reply(request: Request) -> Response:
        env = await door.verified(request)
        await door.store.push(keys.REPLY, env.encode())
        return _accepted()

    async def cmd(request: Request) -> Response:
        env = await door.verified(request)
        retqueue = str(uuid.uuid4())
        await door.store.push(keys.REMOTE, env.replace(pxy=True, ret=retqueue).encode())
        return Response(json.dumps({"retqueue": retqueue}), 200, media_type=JSON_TYPE)

    async def result(request: Request) -> Response:
        retqueue = _retqueue(await request.body())
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
        return Response(json.dumps(items), 200, media_type=JSON_TYPE)

    routes = [
        Route("/zbus-remote", _Endpoint(remote)),
        Route("/zbus-reply", _Endpoint(reply)),
        Route("/zbus-cmd", _Endpoint(cmd)),
        Route("/zbus-result", _Endpoint(result)),
    ]
    return Starlette(routes=routes)


def seen_id(env: Envelope) -> str:
    """What identifies one request from a twin: its uid, and a digest of its command and payload."""
    digest = hashlib.md5(f"{env.cmd}\n{env.dat}".encode(), usedforsecurity=False).hexdigest()[:16]
    return f"{env.uid}.{digest}"


def dedup_ttl_s(env: Envelope, freshness_s: float) -> int:
    """How long a re-send of ``env`` may still arrive: the sender re-sends it until its lifetime ends."""
    return env.lifetime_s + int(freshness_s)


def _accepted() -> Response:
    return Response(ACCEPTED_BODY, 200, media_type=JSON_TYPE)


class _Endpoint:
    """Wrap ``handler`` as a plain ASGI app (not a function), so starlette routes every HTTP method to it."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self._handler(request)
        except RejectedRequest as exc:
            log.info("refused %s %s: %s", request.method, request.url.path, exc.message)
            response = Response(http_error_body(exc.message), exc.status, media_type=JSON_TYPE)
        except RedisError as exc:
            log.error("redis failed while handling %s: %s", request.url.path, exc)
            response = Response(
                http_error_body(f"couldn't queue the message, the site's redis failed: {exc}"),
                503,
                media_type=JSON_TYPE,
            )
        await response(scope, receive, send)


def _retqueue(body: bytes) -> str:
    try:
        value = json.loads(body)["retqueue"]
    except (ValueError, KeyError, TypeError) as exc:
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
