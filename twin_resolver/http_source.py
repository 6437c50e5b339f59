"""Twins from an HTTP twin source, as go-rmb's explorer resolver reads them.

``GET {url}/twin/{id}`` answers ``{"version": 1, "id": 7, "account": "<SS58 or 0x hex>", "ip": "300:1::2"}``;
404 means there is no such twin. There is no documented way to ask such a source for the twin of an
account, so a site using one must be told its own twin id.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from twin_resolver.accounts import account_from_text, relay_fields
from twin_resolver.base import ResolverUnavailable, Twin, TwinNotFound


class HttpResolver:
    """A :class:`~twin_resolver.base.Resolver` over an HTTP twin source (one keep-alive client)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, client: httpx.AsyncClient | None = None) -> None:
        """Resolve from the source at ``url`` (``http://`` or ``https://``), each request bounded by
        ``timeout_s``. A given ``client`` is used as it is and left open by :meth:`aclose`."""
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._owns_client = client is None
        # trust_env off: a site's proxy variables are meant for its apps, not for finding its peers.
        self._client = client or httpx.AsyncClient(timeout=timeout_s, trust_env=False)

    async def get_twin(self, twin_id: int) -> Twin:
        """The twin with this id, :class:`TwinNotFound` on 404, else :class:`ResolverUnavailable`."""
        url = f"{self.url}/twin/{twin_id}"
        try:
            response = await self._client.get(url)
        except httpx.TimeoutException as exc:
            raise ResolverUnavailable(
                f"the twin source at {self.url} did not answer for twin {twin_id} in {self._timeout_s:g} s"
            ) from exc
        except httpx.HTTPError as exc:
            cause = str(exc) or type(exc).__name__
            raise ResolverUnavailable(f"couldn't reach the twin source at {self.url}: {cause}") from exc
        if response.status_code == 404:
            raise TwinNotFound(twin_id)
        if response.status_code != 200:
            raise ResolverUnavailable(
                f"the twin source at {self.url} answered HTTP {response.status_code} for twin {twin_id}"
            )
        try:
            return twin_from_json(twin_id, json.loads(response.content))
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
            raise ResolverUnavailable(
                f"the twin source at {self.url} sent an unreadable answer for twin {twin_id}: {exc}"
            ) from exc

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        """Always :class:`ResolverUnavailable`: an HTTP twin source has no account look-up."""
        raise ResolverUnavailable("the HTTP twin source cannot look up an account; pass --twin N")

    async def aclose(self) -> None:
        """Close the HTTP client if this resolver made it."""
        if self._owns_client:
            await self._client.aclose()


def twin_from_json(twin_id: int, doc: Any) -> Twin:
    """A :class:`Twin` from the source's answer for ``twin_id``; ``ValueError`` says what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("id", twin_id) != twin_id:
        raise ValueError(f"it is twin {doc['id']!r}")
    account = doc.get("account", doc.get("account_id"))
    if not isinstance(account, str):
        raise ValueError(f"account must be a string, got {account!r}")
    ip = doc.get("ip") or ""
    if not isinstance(ip, str):
        raise ValueError(f"ip must be a string, got {ip!r}")
    relay, encryption_key = relay_fields(doc)
    return Twin(
        id=twin_id,
        address=ip.strip(),
        public_key=account_from_text(account),
        relay=relay,
        encryption_key=encryption_key,
    )
