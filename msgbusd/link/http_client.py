"""HTTP requests to other servers over keep-alive connections, with aiohttp, or on a connection of their own
(:mod:`msgbusd.link.one_shot`) when the connection would not be used again.

aiohttp's HTTP parser is compiled: one request costs about a fifth of the CPU it takes with httpx here
(0.14-0.29 ms against 0.7-3.5 ms on loopback). The bus sends every message between sites this way, and
the rules router its calls to cloud APIs and edge services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from msgbusd.link.http_reply import HttpFailed, HttpReply, connection_failure
from msgbusd.link.one_shot import OneShotRequests


class HttpClients:
    """HTTP requests over keep-alive connections (at most ``per_origin`` to one origin, the other requests
    wait their turn), each answered or failed within its timeout."""

    def __init__(self, timeout_s: float, per_origin: int = 64) -> None:
        self._timeout_s = timeout_s
        self._per_origin = per_origin
        self._session: aiohttp.ClientSession | None = None
        self._one_shot = OneShotRequests()

    async def websocket(
        self, url: str, *, max_message_bytes: int, timeout_s: float
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a WebSocket to ``url``, whose pings its reader answers and sends itself (aiohttp's own are
        off: :class:`~msgbusd.link.link_sockets.ClientSocket`); raises
        ``aiohttp.WSServerHandshakeError`` when the server answers with plain HTTP, ``aiohttp.ClientError``
        or ``TimeoutError`` when it cannot be reached."""
        session = self._open()
        async with asyncio.timeout(timeout_s):
            return await session.ws_connect(
                url, autoping=False, max_msg_size=max_message_bytes, autoclose=True, compress=0
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
        keep_alive: bool = True,
    ) -> HttpReply:
        """Make one request; raises :class:`HttpFailed` when no answer came. ``keep_alive`` False: on a
        connection of its own, closed once answered (``Connection: close``)."""
        timeout = timeout_s if timeout_s is not None else self._timeout_s
        if not keep_alive:
            return await self._one_shot.request(
                method, url, headers=headers, content=content, timeout_s=timeout
            )
        session = self._open()
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
        except aiohttp.ClientConnectorError as exc:
            # The same words as a request on a connection of its own ("connection refused").
            reason = str(exc) if isinstance(exc, aiohttp.ClientSSLError) else connection_failure(exc.os_error)
            raise HttpFailed(reason, timed_out=False) from None
        except aiohttp.ClientError as exc:
            raise HttpFailed(str(exc) or type(exc).__name__, timed_out=False) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
