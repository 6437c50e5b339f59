"""Many twins in one process: a range of twins, each with its own key, answering a site's requests as that
twin, so that tests and benchmarks can talk to thousands of twins without thousands of processes.

    python -m testing.many_twins --twins twins.json --first 1000 --count 10000 --down 2000

Twin ``N``'s ed25519 key comes from its id alone (:func:`twin_signer`), so any process can compute it.
Every twin has a loopback address of its own (127.1.0.1 for the first, and so on: all of 127.0.0.0/8 is
loopback on Linux), as if each ran its own site: a site keeps only a few connections to one host and port
(``PEER_CONNECTIONS`` in :mod:`msgbusd.site.daemon`), holds one per open link, and asks one address once
whether it takes links. An up twin's address in the twin file is the base URL ``http://127.1.X.Y:PORT/t/N``
(sites use such a URL as it is); a down twin's is the same on ``DOWN_PORT``, which this process holds bound
without listening, so that connecting there is refused. One socket serves every address: it listens on
``PORT`` bound to the loopback interface (``SO_BINDTODEVICE``, Linux 5.7 or later), so nothing beyond this
machine reaches it. ``127.0.0.1:PORT`` serves everything too.

The twins are added to the twin file given (its other entries are kept), and the same file says which site
twins send requests: their keys check the requests, their addresses take the replies.

Served for each up twin ``N``:

``/t/N/zbus-remote``
    go-rmb's checks (JSON, freshness, the source twin's key, the signature) and answers; an accepted
    request is answered as a service would: same uid, ``src`` and ``dst`` swapped, the request's ``dat``
    (or ``--reply-bytes`` bytes), signed by twin N and POSTed to the source site's ``/zbus-reply``.
``/t/N/zbus-reply``
    checked the same way and counted (these twins send no requests, so nothing waits for a reply).
``/t/N/zbus-link``
    the site's half of a link's handshake as twin N; every ``send`` frame is acked with one result per
    message and the replies go back on the link as ``send`` frames (to ``/zbus-reply``), by POST when the
    link breaks first. With ``--no-links`` the upgrade is answered 404, as go-rmb does, and sites POST.
    A request sent again (its answer was lost) is answered again: the site keeps the first reply.
``/t/N/zbus-batch``
    404, as go-rmb: a site then sends one POST per message (and counts a 404 to its probe as an answer).

``GET /stats`` gives the counts as JSON, ``GET /stats?per_twin=1`` each twin's too (see
:meth:`Counts.as_json`); the totals go to stdout on SIGTERM. :class:`ManyTwinsProcess` runs it for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from msgbusd.door.validation import validate
from msgbusd.errors import DeliveryError, InvalidMessage, RejectedRequest
from msgbusd.identity.signing import SignatureError, Signer, verify, verify_digest
from msgbusd.sending.http_client import HttpClients
from msgbusd.sending.link_sockets import REFUSED, RETIRED, LinkClosed
from msgbusd.sending.links import Link, handshake_digest, send_envelopes
from msgbusd.sending.posts import REMOTE_PATH, REPLY_PATH, PostClient
from testing.local_sites import free_port, stop_process, wait_until
from twin_resolver.base import Resolver, ResolverError, Twin, TwinNotFound
from twin_resolver.static import StaticResolver, load_twin_file, write_twin_file
from wire.envelope import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Envelope,
    EnvelopeDecodeError,
    encode_payload,
    envelope_size_limit,
)
from wire.error_texts import go_duration, http_error_body

log = logging.getLogger("testing.many_twins")

READY_LINE = "many-twins ready"
STATS_LINE = "many-twins stats"
# Twin N's key is the ed25519 key of blake2b(KEY_PREFIX + "N").
KEY_PREFIX = b"msgbus many twins\n"
ACCEPTED_BODY = b'{"status": "accepted"}'
JSON_TYPE = "application/json"
# Replies sent in one frame on a link at most.
LINK_BATCH = 64
MAX_FRAME_BYTES = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES)
# The address of the first twin; the next ones take the addresses after it.
FIRST_HOST = ipaddress.IPv4Address("127.1.0.1")
# Where the counts are served, and everything else too.
CONTROL_HOST = "127.0.0.1"


def twin_signer(twin_id: int) -> Signer:
    """Twin ``twin_id``'s key (the same in every process)."""
    seed = hashlib.blake2b(KEY_PREFIX + str(twin_id).encode(), digest_size=32).digest()
    return Signer(seed, "ed25519")


@dataclass(frozen=True)
class TwinRange:
    """Twins ``first`` to ``first + count - 1``; those in ``down`` have an address where nothing listens."""

    first: int
    count: int
    down: frozenset[int] = frozenset()

    @classmethod
    def of(cls, first: int, count: int, down_last: int = 0, down_ids: Iterable[int] = ()) -> TwinRange:
        """The range, with its last ``down_last`` twins and the twins ``down_ids`` down."""
        if first < 1 or not 1 <= count <= 2**24 - 2**16 - 1 or not 0 <= down_last <= count:
            raise ValueError(f"bad twin range: first {first}, count {count}, {down_last} down")
        down = set(range(first + count - down_last, first + count)) | set(down_ids)
        outside = sorted(twin for twin in down if not first <= twin < first + count)
        if outside:
            raise ValueError(f"down twins {outside} are not in {first}..{first + count - 1}")
        return cls(first, count, frozenset(down))

    def host_of(self, twin: int) -> str:
        """``twin``'s loopback address."""
        return str(FIRST_HOST + (twin - self.first))

    @property
    def ids(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def up_ids(self) -> list[int]:
        return [twin for twin in self.ids if twin not in self.down]


def twin_entries(twins: TwinRange, port: int, down_port: int, signers: Mapping[int, Signer]) -> list[Twin]:
    """The twin file's entries of ``twins``, served on ``port`` (up) or refused on ``down_port`` (down)."""
    return [
        Twin(
            id=twin,
            address=f"{_base_url(twins, twin, port, down_port)}/t/{twin}",
            public_key=signer.public_key,
        )
        for twin, signer in ((twin, signers[twin]) for twin in twins.ids)
    ]


def _base_url(twins: TwinRange, twin: int, port: int, down_port: int) -> str:
    return f"http://{twins.host_of(twin)}:{down_port if twin in twins.down else port}"


def add_to_twin_file(path: Path, twins: Sequence[Twin]) -> bool:
    """Put ``twins`` in the twin file at ``path`` (replacing entries with their ids, keeping the others);
    False when they were all there already, and the file was left alone (sites reload a changed file)."""
    existing = load_twin_file(path) if path.exists() else {}
    if all(existing.get(twin.id) == twin for twin in twins):
        return False
    ours = {twin.id for twin in twins}
    write_twin_file(path, [*(twin for twin in existing.values() if twin.id not in ours), *twins])
    return True


@dataclass
class Counts:
    """What the twins received and answered, in total and per twin."""

    # Requests taken, by the way they came: "post" or "link".
    requests: Counter[str] = field(default_factory=Counter)
    # Replies the source site took (answered 200), by the way they went.
    replies: Counter[str] = field(default_factory=Counter)
    replies_failed: int = 0
    # Requests and replies refused (unreadable, stale, unknown source, bad signature).
    refused: int = 0
    # Replies sent to these twins (checked and dropped).
    replies_received: int = 0
    links_opened: int = 0
    links_refused: int = 0
    received: Counter[int] = field(default_factory=Counter)
    answered: Counter[int] = field(default_factory=Counter)

    def as_json(self, twins: TwinRange, links_open: int, *, per_twin: bool = False) -> dict[str, Any]:
        """``requests`` taken and ``replies`` the sites took, each by way (``post``, ``link``);
        ``replies_failed``, ``refused`` (requests and replies that failed go-rmb's checks),
        ``replies_received`` (replies sent to these twins), ``links`` open, opened and refused; with
        ``per_twin``, each twin's requests ``received`` and replies ``answered``, by twin id."""
        totals = {
            "twins": twins.count,
            "down": len(twins.down),
            "requests": {"post": self.requests["post"], "link": self.requests["link"]},
            "replies": {"post": self.replies["post"], "link": self.replies["link"]},
            "replies_failed": self.replies_failed,
            "refused": self.refused,
            "replies_received": self.replies_received,
            "links": {"open": links_open, "opened": self.links_opened, "refused": self.links_refused},
        }
        if not per_twin:
            return totals
        twin_ids = sorted(self.received.keys() | self.answered.keys())
        by_twin = {str(t): {"received": self.received[t], "answered": self.answered[t]} for t in twin_ids}
        return {**totals, "per_twin": by_twin}


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
        self.counts.requests[way] += 1
        self.counts.received[twin] += 1
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
        twin = int(request.match_info["twin"])
        if twin not in self._signers:
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
        sock = _LinkSocket(ws)
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

    async def _greet(self, sock: _LinkSocket, twin: int) -> tuple[int, int]:
        """The site's half of a link's handshake, as ``twin`` (see :class:`msgbusd.sending.links.Links`):
        the opener's twin, once it proved it holds that twin's key, and the largest envelope it takes."""
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
        self, harness: ManyTwins, twin: int, site: int, sock: _LinkSocket, site_max_bytes: int
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

    async def _answer(self, site: int, messages: list[Any]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for message in messages:
            try:
                path, env = _link_message(message)
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


class _LinkSocket:
    """This end of a link (an aiohttp server WebSocket), as :class:`~msgbusd.sending.links.Link` drives it."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._reason = ""

    async def send(self, data: bytes) -> None:
        try:
            await self._ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as exc:
            raise LinkClosed(str(exc) or type(exc).__name__) from exc

    async def receive(self) -> bytes | None:
        message = await self._ws.receive()
        if message.type == WSMsgType.BINARY:
            return bytes(message.data)
        if message.type == WSMsgType.TEXT:
            return str(message.data).encode()
        if message.type == WSMsgType.CLOSE:
            self._reason = f"closed by the site ({message.data} {message.extra or ''})".strip()
        elif message.type == WSMsgType.ERROR:
            self._reason = f"failed: {message.data}"
        return None

    async def close(self, code: int, reason: str) -> None:
        self._reason = self._reason or reason
        with contextlib.suppress(Exception):
            await self._ws.close(code=code, message=reason.encode()[:120])

    def close_reason(self) -> str:
        return self._reason or "closed"

    def refused(self) -> bool:
        return self._ws.close_code == REFUSED

    def retired(self) -> bool:
        return self._ws.close_code == RETIRED


class _Refused(Exception):
    """A link handshake refused; the message is the close reason."""


def _decoded(body: bytes) -> Envelope:
    try:
        return Envelope.decode(body)
    except EnvelopeDecodeError as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc


def _link_message(message: object) -> tuple[str, Envelope]:
    if not isinstance(message, dict) or message.get("path") not in (REMOTE_PATH, REPLY_PATH):
        raise RejectedRequest(400, "couldn't parse json")
    try:
        return str(message["path"]), Envelope.from_wire(message.get("envelope"))
    except EnvelopeDecodeError as exc:
        raise RejectedRequest(400, "couldn't parse json") from exc


async def serve(settings: Settings, stopping: asyncio.Event, on_ready: Callable[[str], None]) -> Counts:
    """Serve the twins until ``stopping`` is set; ``on_ready`` gets a line saying where, once they take
    requests. Returns the counts."""
    twins = settings.twins
    listener = _loopback_socket(settings.port)
    # Bound and never listening: a connection to it is refused, and no other server can take the port.
    refuser = _loopback_socket(settings.down_port)
    try:
        signers = {twin: twin_signer(twin) for twin in twins.ids}
        port, down_port = listener.getsockname()[1], refuser.getsockname()[1]
        add_to_twin_file(settings.twins_file, twin_entries(twins, port, down_port, signers))
        http = HttpClients(settings.timeout_s, per_origin=settings.reply_workers)
        harness = ManyTwins(settings, signers, StaticResolver(settings.twins_file), http)
        runner = web.AppRunner(harness.app(), access_log=None, shutdown_timeout=settings.timeout_s)
        await runner.setup()
        try:
            await web.SockSite(runner, listener, backlog=4096).start()
            on_ready(
                f"{READY_LINE}: http://{CONTROL_HOST}:{port}, twins {twins.first}-{twins.ids[-1]} "
                f"({len(twins.down)} down, refused on port {down_port}), twin file {settings.twins_file}"
            )
            async with asyncio.TaskGroup() as group:
                workers = [group.create_task(harness.post_replies()) for _ in range(settings.reply_workers)]
                await stopping.wait()
                await harness.close_links()
                await harness.drain(settings.timeout_s)
                for worker in workers:
                    worker.cancel()
        finally:
            await runner.cleanup()
            await http.aclose()
        return harness.counts
    finally:
        listener.close()
        refuser.close()


def _loopback_socket(port: int) -> socket.socket:
    """A socket on ``port`` of every loopback address, and of nothing else (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        twins = TwinRange.of(args.first, args.count, args.down, args.down_ids)
    except ValueError as exc:
        raise SystemExit(f"many_twins: {exc}") from None
    settings = Settings(
        twins=twins,
        twins_file=args.twins,
        port=args.port,
        down_port=args.down_port,
        links=args.links,
        reply_bytes=args.reply_bytes,
        freshness_s=args.freshness,
        timeout_s=args.timeout,
        reply_workers=args.reply_workers,
        reply_tries=args.reply_tries,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        counts = runner.run(_run_until_signalled(settings))
    _print(f"{STATS_LINE}: {json.dumps(counts.as_json(twins, 0))}")


async def _run_until_signalled(settings: Settings) -> Counts:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    return await serve(settings, stopping, _print)


def _print(line: str) -> None:
    print(line, flush=True)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def comma_separated_ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testing.many_twins", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--twins", type=Path, required=True, help="Twin file: the twins are added to it.")
    parser.add_argument("--first", type=int, default=1000, help="The first twin id.")
    parser.add_argument("--count", type=int, default=100, help="How many twins.")
    parser.add_argument("--down", type=int, default=0, help="The last N twins of the range are down.")
    parser.add_argument(
        "--down-ids",
        type=comma_separated_ids,
        default=[],
        help="These twins (ids, comma-separated) are down too.",
    )
    parser.add_argument("--port", type=int, default=0, help="Where the up twins are served (0: any).")
    parser.add_argument("--down-port", type=int, default=0, help="Where the down twins refuse (0: any).")
    parser.add_argument(
        "--no-links", dest="links", action="store_false", help="Answer link upgrades 404: sites POST."
    )
    parser.add_argument("--reply-bytes", type=int, default=None, help="Reply with N bytes, not the echo.")
    parser.add_argument("--freshness", type=float, default=60.0, help="Seconds a request may be old.")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="Seconds a reply POST or a frame may take."
    )
    parser.add_argument("--reply-workers", type=int, default=64, help="Reply POSTs at once.")
    parser.add_argument("--reply-tries", type=int, default=3, help="Tries of a reply a site does not take.")
    parser.add_argument("--log-level", default="warning", help="debug|info|warning|error.")
    return parser


@dataclass
class ManyTwinsProcess:
    """``python -m testing.many_twins`` as a child process, for tests and benchmarks.

    Its twins are known before it starts (:meth:`twins`), so a site's twin file can hold them from the
    beginning::

        harness = ManyTwinsProcess(count=300, down=50)
        cluster = LocalCluster(size=1, extra_twins=harness.twins()).start()
        harness.start(cluster.twins_file)
    """

    first: int = 1000
    count: int = 100
    down: int = 0
    down_ids: Sequence[int] = ()
    links: bool = True
    reply_bytes: int | None = None
    port: int = field(default_factory=free_port)
    down_port: int = field(default_factory=free_port)
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def range(self) -> TwinRange:
        return TwinRange.of(self.first, self.count, self.down, self.down_ids)

    @property
    def up_ids(self) -> list[int]:
        return self.range.up_ids

    @property
    def down_twin_ids(self) -> list[int]:
        return sorted(self.range.down)

    @property
    def url(self) -> str:
        """Where every twin and the counts are served."""
        return f"http://{CONTROL_HOST}:{self.port}"

    def twins(self) -> list[Twin]:
        """The twin file's entries of the twins, as the process writes them."""
        twins = self.range
        return twin_entries(twins, self.port, self.down_port, {twin: twin_signer(twin) for twin in twins.ids})

    def command(self, twins_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "testing.many_twins", "--twins", str(twins_file),
            "--first", str(self.first), "--count", str(self.count), "--down", str(self.down),
            "--down-ids", ",".join(map(str, self.down_ids)),
            "--port", str(self.port), "--down-port", str(self.down_port),
            *([] if self.links else ["--no-links"]),
            *([] if self.reply_bytes is None else ["--reply-bytes", str(self.reply_bytes)]),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, twins_file: Path, timeout_s: float = 30.0) -> ManyTwinsProcess:
        """Start serving the twins (adding them to ``twins_file`` unless they are there) and wait until
        they take requests."""
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="many-twins-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        with open(self.log_path, "ab") as log_file:
            offset = log_file.tell()
            self.process = subprocess.Popen(
                self.command(twins_file), stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
        wait_until(lambda: self._ready_since(offset), timeout_s, f"{self.count} twins to be served")
        return self

    def stats(self, *, per_twin: bool = False) -> dict[str, Any]:
        """The counts (see :meth:`Counts.as_json`)."""
        # No proxy: the twins are on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}/stats{'?per_twin=1' if per_twin else ''}", timeout=5) as response:
            stats: dict[str, Any] = json.load(response)
        return stats

    def wait_for(
        self, condition: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0, what: str = "the counts"
    ) -> dict[str, Any]:
        """Poll the counts until ``condition`` holds for them; returns them."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.clear()
            seen.update(self.stats())
            return condition(seen)

        wait_until(holds, timeout_s, what)
        return seen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait; returns the exit status."""
        process = self.process
        stop_process(process, timeout_s)
        self.process = None
        return process.returncode if process else None

    def _ready_since(self, offset: int) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"many_twins exited with {self.process.returncode}:\n{self.log()}")
        assert self.log_path is not None
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            return READY_LINE.encode() in log_file.read()


if __name__ == "__main__":
    main()
