"""HTTP delivery of signed envelopes to other sites' daemons."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from msgbusd.envelope import Envelope
from msgbusd.errors import DeliveryError
from msgbusd.signing import Signer
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError

REMOTE_PATH = "/zbus-remote"
REPLY_PATH = "/zbus-reply"
# Answers of a site that is up but cannot take messages now (e.g. its Redis is down): like no answer.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


class Forwarder:
    """Stamps, signs and POSTs envelopes to the twin in ``dst[0]``, over keep-alive connections.

    Only HTTP 200 counts as delivered; everything else raises :class:`DeliveryError` whose ``cause`` says
    what went wrong in words a caller can act on.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        resolver: Resolver,
        signer: Signer,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._http = http
        self._resolver = resolver
        self._signer = signer
        self._clock = clock

    async def send(self, env: Envelope, path: str) -> None:
        twin_id = env.dst[0]
        try:
            twin = await self._resolver.get_twin(twin_id)
        except ResolverError as exc:
            raise DeliveryError(str(exc)) from exc
        try:
            url = peer_url(twin.address, path)
        except ValueError as exc:
            raise DeliveryError(f"twin {twin_id} has an unusable address {twin.address!r}: {exc}") from exc
        signed = self._signer.sign(env.replace(now=int(self._clock())))
        try:
            response = await self._http.post(url, content=signed.encode())
        except httpx.TimeoutException as exc:
            raise DeliveryError(f"twin {twin_id} at {url} did not answer in time", offline=True) from exc
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"couldn't reach twin {twin_id} at {url}: {_describe(exc)}", offline=True
            ) from exc
        if response.status_code != 200:
            raise DeliveryError(
                f"twin {twin_id} refused the message: {response.status_code} {_error_message(response)}",
                offline=response.status_code in UNAVAILABLE_STATUSES,
            )


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc)
    return text or type(exc).__name__


def _error_message(response: httpx.Response) -> str:
    try:
        body = json.loads(response.content)
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        for key in ("Message", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return response.text[:200]
