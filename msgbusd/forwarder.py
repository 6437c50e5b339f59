"""HTTP delivery of signed envelopes to other sites' daemons."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus

from msgbusd.envelope import Envelope
from msgbusd.errors import DeliveryError, too_large_text
from msgbusd.http_client import HttpClients, HttpFailed, HttpReply
from msgbusd.link_sockets import LinkClosed
from msgbusd.links import Link, Links
from msgbusd.logs import about
from msgbusd.metrics import Metrics
from msgbusd.signing import Signer
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError, TwinNotFound

log = logging.getLogger("msgbusd.forwarder")

REMOTE_PATH = "/zbus-remote"
REPLY_PATH = "/zbus-reply"
# msgbus sites carry many envelopes per POST here; other RMB daemons answer 404 and get one per POST.
BATCH_PATH = "/zbus-batch"
# Answers of a site that is up but cannot take messages now (e.g. its Redis is down): like no answer.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
JSON_CONTENT = (("content-type", "application/json"),)
# A probe of a site that is down: an empty batch (msgbus sites answer 200, go-rmb sites 404).
EMPTY_BATCH = b'{"messages": []}'
# The longest wait a peer's Retry-After can ask for.
MAX_RETRY_AFTER_S = 10.0
# How long a twin that does not take batches is sent one message per POST before asking again.
LEGACY_RECHECK_S = 600.0


class Forwarder:
    """Stamps, signs and POSTs envelopes to the twin in ``dst[0]``, over keep-alive connections (aiohttp:
    a fifth of httpx's CPU per request).

    Only HTTP 200 counts as delivered; everything else raises :class:`DeliveryError` whose ``cause`` says
    what went wrong in words a caller can act on.
    """

    def __init__(
        self,
        http: HttpClients,
        resolver: Resolver,
        signer: Signer,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        *,
        max_batch_bytes: int = 12 * 1024 * 1024,
        probe_timeout_s: float = 5.0,
        links: Links | None = None,
    ) -> None:
        self._http = http
        self._links = links
        self._probe_timeout_s = probe_timeout_s
        self._max_batch_bytes = max_batch_bytes
        self._resolver = resolver
        self._signer = signer
        self._clock = clock
        self._metrics = metrics or Metrics()
        # Twins that answered 404 to a batch, until when to send them one message per POST.
        self._batch_unsupported: dict[int, float] = {}

    async def send(self, env: Envelope, path: str) -> None:
        """Sign ``env`` and POST it alone to ``path`` of the twin in ``dst[0]``."""
        url = await self._url(env.dst[0], path)
        response = await self._post(env.dst[0], url, self._sign(env).encode())
        if response.status != 200:
            raise _refused(env.dst[0], response)

    async def probe(self, twin_id: int) -> DeliveryError | None:
        """Whether ``twin_id``'s site answers, at the cost of one small POST: None if it does, else what
        went wrong. Any answer but 502/503/504 counts (a go-rmb site answers the empty batch 404)."""
        try:
            url = await self._url(twin_id, BATCH_PATH)
            response = await self._post(
                twin_id, url, EMPTY_BATCH, timeout_s=self._probe_timeout_s, observed=False
            )
        except DeliveryError as exc:
            return exc
        if response.status in UNAVAILABLE_STATUSES:
            return _refused(twin_id, response)
        return None

    async def send_many(
        self, twin_id: int, items: Sequence[tuple[str, Envelope]]
    ) -> list[DeliveryError | None]:
        """Send ``(path, envelope)`` pairs to one twin, in order; one result per item (None: delivered).

        msgbus sites take them all in one POST to ``/zbus-batch``; a site that does not know that endpoint
        (go-rmb) gets them one POST each, and is remembered for a while. Once the twin stops answering, the
        items not sent yet get the same "offline" error without being tried. When links are on, a msgbus
        site gets them over its link instead (:mod:`msgbusd.links`).
        """
        if self._links is not None:
            try:
                replies_only = all(path == REPLY_PATH for path, _env in items)
                link = await self._links.link_to(twin_id, replies_only=replies_only)
            except DeliveryError as exc:
                return [exc] * len(items)
            if link is not None:
                return await self._send_over(link, twin_id, items)
        if len(items) > 1 and self._batch_unsupported.get(twin_id, 0.0) <= self._clock():
            try:
                return await self._send_batch(twin_id, items)
            except _NoBatchEndpoint:
                self._batch_unsupported[twin_id] = self._clock() + LEGACY_RECHECK_S
                log.info(
                    "twin %s takes one message per POST (no %s)",
                    twin_id,
                    BATCH_PATH,
                    extra=about(twin=twin_id),
                )
            except DeliveryError as exc:
                return [exc] * len(items)
        results: list[DeliveryError | None] = []
        for index, (path, env) in enumerate(items):
            try:
                await self.send(env, path)
                results.append(None)
            except DeliveryError as exc:
                results.append(exc)
                if exc.offline or exc.retry_after_s is not None:
                    results += [exc.not_attempted()] * (len(items) - index - 1)
                    break
        return results

    async def _send_over(
        self, link: Link, twin_id: int, items: Sequence[tuple[str, Envelope]]
    ) -> list[DeliveryError | None]:
        assert self._links is not None
        limit = link.peer_max_bytes
        results: list[DeliveryError | None] = [None] * len(items)
        sendable: list[int] = []
        messages: list[bytes] = []
        for index, (path, env) in enumerate(items):
            wire = json.dumps(self._sign(env).to_wire()).encode()
            if len(wire) > limit:
                # The peer said how much it takes when the link opened: this one it would refuse.
                results[index] = _refusal(twin_id, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large_text(limit))
                continue
            sendable.append(index)
            messages.append(b'{"path":"%s","envelope":%b}' % (path.encode(), wire))
        done = 0
        for chunk in _chunks(messages, limit):
            indexes = sendable[done : done + len(chunk)]
            done += len(chunk)
            started = time.perf_counter()
            try:
                answers = await link.send(chunk, self._links.timeout_s)
            except LinkClosed as exc:
                error = DeliveryError(f"the link to twin {twin_id} broke: {exc}", offline=True)
                for index in indexes:
                    results[index] = error
                for index in sendable[done:]:
                    results[index] = error.not_attempted()
                return results
            self._metrics.observe_send("link", time.perf_counter() - started)
            for index, answer in zip(indexes, answers, strict=True):
                if answer.status != 200:
                    results[index] = _refusal(twin_id, answer.status, answer.message, answer.retry_after_s)
        return results

    async def _send_batch(
        self, twin_id: int, items: Sequence[tuple[str, Envelope]]
    ) -> list[DeliveryError | None]:
        url = await self._url(twin_id, BATCH_PATH)
        messages = [_batch_message(path, self._sign(env)) for path, env in items]
        results: list[DeliveryError | None] = []
        for chunk in _chunks(messages, self._max_batch_bytes):
            try:
                results += await self._post_batch(twin_id, url, chunk)
            except DeliveryError as exc:
                if exc.offline or exc.retry_after_s is not None:
                    # The twin stopped answering, or asked to wait: what is left is not tried now.
                    results += [exc] * len(chunk) + [exc.not_attempted()] * (
                        len(items) - len(results) - len(chunk)
                    )
                    break
                results += [exc] * len(chunk)
        return results

    async def _post_batch(self, twin_id: int, url: str, messages: list[bytes]) -> list[DeliveryError | None]:
        response = await self._post(twin_id, url, b'{"messages": [' + b", ".join(messages) + b"]}")
        if response.status in (404, 405):
            raise _NoBatchEndpoint
        if response.status != 200:
            raise _refused(twin_id, response)
        try:
            answers = json.loads(response.body)["results"]
            statuses = [(int(a["status"]), str(a.get("message", ""))) for a in answers]
        except (ValueError, KeyError, TypeError) as exc:
            raise DeliveryError(f"twin {twin_id} answered a batch with something unreadable") from exc
        if len(statuses) != len(messages):
            raise DeliveryError(
                f"twin {twin_id} answered {len(statuses)} results for {len(messages)} messages"
            )
        return [None if status == 200 else _refusal(twin_id, status, message) for status, message in statuses]

    def _sign(self, env: Envelope) -> Envelope:
        return self._signer.sign(env.replace(now=int(self._clock())))

    async def _url(self, twin_id: int, path: str) -> str:
        try:
            twin = await self._resolver.get_twin(twin_id)
        except ResolverError as exc:
            raise DeliveryError(
                str(exc), kind="not_found" if isinstance(exc, TwinNotFound) else "other"
            ) from exc
        try:
            return peer_url(twin.address, path)
        except ValueError as exc:
            raise DeliveryError(f"twin {twin_id} has an unusable address {twin.address!r}: {exc}") from exc

    async def _post(
        self, twin_id: int, url: str, body: bytes, *, timeout_s: float | None = None, observed: bool = True
    ) -> HttpReply:
        started = time.perf_counter()
        try:
            response = await self._http.request(
                "POST", url, headers=JSON_CONTENT, content=body, timeout_s=timeout_s
            )
        except HttpFailed as exc:
            if exc.timed_out:
                raise DeliveryError(f"twin {twin_id} at {url} did not answer in time", offline=True) from exc
            raise DeliveryError(f"couldn't reach twin {twin_id} at {url}: {exc}", offline=True) from exc
        if observed:
            self._metrics.observe_send(
                "reply" if url.endswith(REPLY_PATH) else "remote", time.perf_counter() - started
            )
        return response


def _batch_message(path: str, env: Envelope) -> bytes:
    return json.dumps({"path": path, "envelope": env.to_wire()}).encode()


def _chunks(messages: list[bytes], max_bytes: int) -> list[list[bytes]]:
    """``messages`` in order, cut so that each POST stays under the peer's size limit (taken to be ours);
    a message larger than that alone goes alone, and the peer's 413 becomes its error."""
    chunks: list[list[bytes]] = [[]]
    size = 0
    for message in messages:
        if chunks[-1] and size + len(message) + 64 > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(message)
        size += len(message) + 2
    return chunks


class _NoBatchEndpoint(Exception):
    """The peer answered 404/405 to a batch: it is not a msgbus site."""


def _refused(twin_id: int, response: HttpReply) -> DeliveryError:
    status = response.status
    retry_after_s = _retry_after_s(response) if status == HTTPStatus.SERVICE_UNAVAILABLE else None
    return _refusal(twin_id, status, _error_message(response), retry_after_s)


def _refusal(twin_id: int, status: int, message: str, retry_after_s: float | None = None) -> DeliveryError:
    if retry_after_s is not None:
        return DeliveryError(
            f"twin {twin_id} cannot take messages now: {status} {message}",
            kind="busy",
            retry_after_s=retry_after_s,
        )
    offline = status in UNAVAILABLE_STATUSES
    return DeliveryError(
        f"twin {twin_id} refused the message: {status} {message}",
        offline=offline,
        kind="unreachable" if offline else "refused",
        final=status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    )


def _retry_after_s(response: HttpReply) -> float | None:
    """A 503's ``Retry-After`` in seconds (the delay form; a date is read as "soon"), capped so that a
    peer cannot park our messages for long."""
    value = response.header("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _error_message(response: HttpReply) -> str:
    try:
        body = json.loads(response.body)
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("Message", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return response.body[:200].decode("utf-8", "replace")
