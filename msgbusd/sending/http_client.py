"""HTTP requests to other servers over keep-alive connections, with aiohttp.

aiohttp's HTTP parser is compiled: one request costs about a fifth of the CPU it takes with httpx here
(0.14-0.29 ms against 0.7-3.5 ms on loopback). The bus sends every message between sites this way, and
the rules router its calls to cloud APIs and edge services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class HttpReply:
    """What an HTTP request got: the status, every header (repeated ones too) and the decoded body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


class HttpFailed(Exception):
    """An HTTP request that got no answer; ``timed_out`` tells a timeout from a connection that failed."""

    def __init__(self, reason: str, *, timed_out: bool) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class HttpClients:
    """HTTP requests over keep-alive connections (at most ``per_origin`` to one origin, the other requests
    wait their turn), each answered or failed within its timeout."""

    def __init__(self, timeout_s: float, per_origin: int = 64) -> None:
        self._timeout_s = timeout_s
        self._per_origin = per_origin
        self._session: aiohttp.ClientSession | None = None

    async def websocket(
        self, url: str, *, heartbeat_s: float, max_message_bytes: int, timeout_s: float
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a WebSocket to ``url`` (pinged every ``heartbeat_s``, closed when a pong is late); raises
        ``aiohttp.WSServerHandshakeError`` when the server answers with plain HTTP, ``aiohttp.ClientError``
        or ``TimeoutError`` when it cannot be reached."""
        session = self._open()
        return await asyncio.wait_for(
            session.ws_connect(
                url,
                heartbeat=heartbeat_s,
                max_msg_size=max_message_bytes,
                autoclose=True,
                compress=0,
            ),
            timeout_s,
        )

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._per_origin)
            self._session = aiohttp.ClientSession(connector=connector)
            # aiohttp sends a GET, PUT or DELETE again on its own when the connection drops before the
            # answer; the caller is told what happened instead (a call must not run twice behind its
            # back). There is no public switch for it.
            self._session._retry_connection = False
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        content: bytes = b"",
        timeout_s: float | None = None,
    ) -> HttpReply:
        """Make one request; raises :class:`HttpFailed` when no answer came."""
        session = self._open()
        timeout = timeout_s if timeout_s is not None else self._timeout_s
        try:
            async with session.request(
                method,
                url,
                headers=list(headers),
                data=content,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                body = await response.read()
                return HttpReply(response.status, list(response.headers.items()), body)
        except TimeoutError:
            raise HttpFailed(f"no answer within {timeout:g}s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise HttpFailed(str(exc) or type(exc).__name__, timed_out=False) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
