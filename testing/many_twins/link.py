"""This end of a link a site opened to a twin, on the wire: the aiohttp server WebSocket as
:class:`~msgbusd.link.open_link.Link` drives it. The messages of its ``send`` frames are read as a site's
door reads them (:func:`msgbusd.door.http_api.batch_item`); what a twin does with a link is
:class:`~testing.many_twins.endpoints.TwinLink`."""

from __future__ import annotations

import contextlib

from aiohttp import WSMsgType, web

from msgbusd.link.link_sockets import REFUSED, RETIRED, LinkClosed


class LinkSocket:
    """This end of a link (an aiohttp server WebSocket), as :class:`~msgbusd.link.open_link.Link` drives
    it."""

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
