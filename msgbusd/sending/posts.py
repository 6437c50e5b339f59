"""Signed envelopes to other sites' daemons by HTTP POST: to go-rmb sites, to msgbus sites run with
``--no-links``, and the probes of sites that are down. msgbus sites are otherwise sent envelopes over a link
(:mod:`msgbusd.link.links`); :mod:`msgbusd.sending.peers` chooses."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus

from msgbusd.errors import UNAVAILABLE_STATUSES, DeliveryError, peer_refusal
from msgbusd.link.batching import batch_message, chunks
from msgbusd.link.http_client import HttpClients
from msgbusd.link.http_reply import HttpFailed, HttpReply
from msgbusd.link.peer_clocks import PeerClocks
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError, Twin, TwinNotFound

log = logging.getLogger("msgbusd.posts")

REMOTE_PATH = "/zbus-remote"
REPLY_PATH = "/zbus-reply"
# msgbus sites carry many envelopes per POST here; other RMB daemons answer 404 and get one per POST.
BATCH_PATH = "/zbus-batch"
JSON_CONTENT = (("content-type", "application/json"),)
# Said by a site that sends again over a link what a peer refuses for its clock (it has links): the peer
# then leaves the refused message's caller waiting for it rather than telling it of the refusal.
SENDER_LINKS_HEADER = "x-msgbus-links"
# A probe of a site that is down: an empty batch (msgbus sites answer 200, go-rmb sites 404).
EMPTY_BATCH = b'{"messages": []}'
# The longest wait a peer's Retry-After can ask for.
MAX_RETRY_AFTER_S = 10.0
# How long a twin that does not take batches is sent one message per POST before asking again.
LEGACY_RECHECK_S = 600.0


class PostClient:
    """POSTs signed envelopes to a twin's site, over keep-alive connections (aiohttp: a fifth of httpx's CPU
    per request).

    Only HTTP 200 counts as delivered; everything else raises :class:`DeliveryError` whose ``cause`` says
    what went wrong in words a caller can act on.
    """

    def __init__(
        self,
        http: HttpClients,
        resolver: Resolver,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        *,
        max_batch_bytes: int,
        probe_timeout_s: float = 5.0,
        clocks: PeerClocks | None = None,
        has_links: bool = False,
    ) -> None:
        self._http = http
        self._headers = (*JSON_CONTENT, (SENDER_LINKS_HEADER, "1")) if has_links else JSON_CONTENT
        # The peers' clocks, as the Date of their answers tells (named when a refusal is for a clock).
        self.clocks = clocks or PeerClocks(clock)
        self._probe_timeout_s = probe_timeout_s
        self._max_batch_bytes = max_batch_bytes
        self._resolver = resolver
        self._clock = clock
        self._metrics = metrics or Metrics()
        # Twins that answered 404 to a batch, until when to send them one message per POST.
        self._batch_unsupported: dict[int, float] = {}

    async def send(self, twin_id: int, path: str, envelope: bytes, *, keep_alive: bool = True) -> None:
        """POST one encoded, signed envelope to ``path`` of ``twin_id``'s site; ``keep_alive``: keep the
        connection for the next POST (a twin's relay is shared: its connection is always kept)."""
        twin = await self._twin(twin_id)
        url = self._twin_url(twin, path)
        response = await self._post(twin_id, url, envelope, keep_alive=keep_alive or bool(twin.relay))
        if response.status != 200:
            raise self._refused(twin_id, response)

    async def probe(self, twin_id: int) -> DeliveryError | None:
        """Whether ``twin_id``'s site answers, at the cost of one small POST: None if it does, else what
        went wrong. Any answer but 502/503/504 counts (a go-rmb site answers the empty batch 404)."""
        try:
            url = await self._url(twin_id, BATCH_PATH)
            response = await self._post(
                twin_id, url, EMPTY_BATCH, timeout_s=self._probe_timeout_s, observed=False, keep_alive=False
            )
        except DeliveryError as exc:
            return exc
        if response.status in UNAVAILABLE_STATUSES:
            return self._refused(twin_id, response)
        return None

    async def send_many(
        self, twin_id: int, items: Sequence[tuple[str, bytes]], *, keep_alive: bool = True
    ) -> list[DeliveryError | None]:
        """Send ``(path, signed envelope)`` pairs to one twin, in order; one result per item (None:
        delivered). ``keep_alive`` False: a lone message to a twin that is not busy, whose connection is
        closed once it is answered instead of being kept idle (thousands of twins sent one message each would
        otherwise hold a connection each, and the daemon's memory, for 15 s).

        msgbus sites take them all in one POST to ``/zbus-batch``; a site that does not know that endpoint
        (go-rmb) gets them one POST each, and is remembered for a while. Once the twin stops answering, the
        items not sent yet get the same "offline" error without being tried.
        """
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
        keep_alive = keep_alive or len(items) > 1
        for index, (path, envelope) in enumerate(items):
            try:
                await self.send(twin_id, path, envelope, keep_alive=keep_alive)
                results.append(None)
            except DeliveryError as exc:
                results.append(exc)
                if exc.offline or exc.retry_after_s is not None:
                    results += [exc.not_attempted()] * (len(items) - index - 1)
                    break
        return results

    async def _send_batch(
        self, twin_id: int, items: Sequence[tuple[str, bytes]]
    ) -> list[DeliveryError | None]:
        url = await self._url(twin_id, BATCH_PATH)
        messages = [batch_message(path, envelope) for path, envelope in items]
        results: list[DeliveryError | None] = []
        for chunk in chunks(messages, self._max_batch_bytes):
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
            raise self._refused(twin_id, response)
        try:
            answers = json.loads(response.body)["results"]
            statuses = [(int(a["status"]), str(a.get("message", ""))) for a in answers]
        except (ValueError, KeyError, TypeError) as exc:
            raise DeliveryError(f"twin {twin_id} answered a batch with something unreadable") from exc
        if len(statuses) != len(messages):
            raise DeliveryError(
                f"twin {twin_id} answered {len(statuses)} results for {len(messages)} messages"
            )
        clock = self.clocks.explain(twin_id)
        return [
            None if status == 200 else peer_refusal(twin_id, status, message, clock=clock)
            for status, message in statuses
        ]

    async def _url(self, twin_id: int, path: str) -> str:
        return self._twin_url(await self._twin(twin_id), path)

    async def _twin(self, twin_id: int) -> Twin:
        try:
            return await self._resolver.get_twin(twin_id)
        except ResolverError as exc:
            raise DeliveryError(
                str(exc), kind="not_found" if isinstance(exc, TwinNotFound) else "other"
            ) from exc

    def _refused(self, twin_id: int, response: HttpReply) -> DeliveryError:
        status = response.status
        retry_after_s = _retry_after_s(response) if status == HTTPStatus.SERVICE_UNAVAILABLE else None
        clock = self.clocks.explain(twin_id)
        return peer_refusal(twin_id, status, _error_message(response), retry_after_s, clock=clock)

    @staticmethod
    def _twin_url(twin: Twin, path: str) -> str:
        # A twin reached through a relay is sent its messages there.
        address = twin.relay or twin.address
        try:
            return peer_url(address, path)
        except ValueError as exc:
            raise DeliveryError(f"twin {twin.id} has an unusable address {address!r}: {exc}") from exc

    async def _post(
        self,
        twin_id: int,
        url: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        observed: bool = True,
        keep_alive: bool = True,
    ) -> HttpReply:
        started = time.perf_counter()
        try:
            response = await self._http.request(
                "POST",
                url,
                headers=self._headers,
                content=body,
                timeout_s=timeout_s,
                keep_alive=keep_alive,
            )
        except HttpFailed as exc:
            if exc.timed_out:
                raise DeliveryError(f"twin {twin_id} at {url} did not answer in time", offline=True) from exc
            raise DeliveryError(f"couldn't reach twin {twin_id} at {url}: {exc}", offline=True) from exc
        self.clocks.heard_date(twin_id, response.header("date"), self.clocks.now())
        if observed:
            self._metrics.observe_send(
                "reply" if url.endswith(REPLY_PATH) else "remote", time.perf_counter() - started
            )
        return response


class _NoBatchEndpoint(Exception):
    """The peer answered 404/405 to a batch: it is not a msgbus site."""


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
