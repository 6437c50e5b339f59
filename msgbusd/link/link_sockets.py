"""The two ends of a link (:mod:`msgbusd.link.links`) behind one small interface: the opener's end is an
aiohttp WebSocket (:class:`ClientSocket`), the site's the connection's own protocol
(:class:`~msgbusd.link.site_socket.SiteSocket`). Both are paced (:mod:`msgbusd.link.link_pacing`): a
``send`` returns once the message is in the kernel's hands, which hold little of it unsent."""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

import aiohttp

from msgbusd.link.link_pacing import pace_client

# The close code of a refused handshake (4000-4999 are the application's).
REFUSED = 4403
# The close code of a link closed because its site no longer needs it (idle, or to make room for another):
# not a break, the other end does not take the peer for down.
RETIRED = 4000


class LinkClosed(Exception):
    """The link closed (or stalled) before a frame was answered; what it carried is sent again.
    ``refused``: the other side refused the handshake, or failed ours. ``unsent``: nothing of the frame
    was written (it waited its turn), so the peer cannot have it: no try of its messages."""

    def __init__(self, reason: str, *, refused: bool = False, unsent: bool = False) -> None:
        super().__init__(reason)
        self.refused = refused
        self.unsent = unsent


class Socket(Protocol):
    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes | None:
        """The next message, or None once the link is closed."""

    async def close(self, code: int, reason: str) -> None: ...

    def close_reason(self) -> str: ...

    def refused(self) -> bool:
        """Whether the other side closed with :data:`REFUSED`."""

    def retired(self) -> bool:
        """Whether the other side closed with :data:`RETIRED`."""


class ClientSocket:
    """The opener's end (aiohttp, opened without aiohttp's own pings: the link answers and sends them, and
    notes when it last heard from the other end)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._reason = ""
        self._code: int | None = None
        self.pacing = pace_client(ws)
        # When something last came from the other end, a pong too (monotonic).
        self.heard_at = time.monotonic()

    async def send(self, data: bytes) -> None:
        try:
            await self._ws.send_bytes(data)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise LinkClosed(str(exc) or type(exc).__name__) from exc

    async def ping(self) -> None:
        """Send a ping (its pong counts as hearing from the other end); raises :class:`LinkClosed`."""
        try:
            await self._ws.ping()
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise LinkClosed(str(exc) or type(exc).__name__) from exc

    async def receive(self) -> bytes | None:
        message = await self._ws.receive()
        self.heard_at = time.monotonic()
        while message.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
            if message.type == aiohttp.WSMsgType.PING:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
                    await self._ws.pong(message.data)
            message = await self._ws.receive()
            self.heard_at = time.monotonic()
        if message.type == aiohttp.WSMsgType.BINARY:
            return bytes(message.data)
        if message.type == aiohttp.WSMsgType.TEXT:
            return str(message.data).encode()
        if message.type == aiohttp.WSMsgType.CLOSE:
            self._code = message.data
            self._reason = f"closed by the peer ({message.data} {message.extra or ''})".strip()
        elif message.type == aiohttp.WSMsgType.ERROR:
            self._reason = f"failed: {message.data}"
        else:
            self._reason = self._reason or "closed"
        return None

    async def close(self, code: int, reason: str) -> None:
        self._reason = self._reason or reason
        with contextlib.suppress(Exception):
            await self._ws.close(code=code, message=reason.encode()[:120])

    def close_reason(self) -> str:
        return self._reason or "closed"

    def refused(self) -> bool:
        return self._code == REFUSED

    def retired(self) -> bool:
        return self._code == RETIRED
