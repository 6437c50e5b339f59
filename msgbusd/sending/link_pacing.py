"""Pacing a link's connection: what waits below the link's writer (:mod:`msgbusd.sending.link_writer`) is kept
small, so that the writer's turns decide what goes on the cable and not the buffers under it.

Two buffers sit between a write and the cable, and each would hold seconds of a thin link's data in front
of a small frame written after a large one:

- the kernel's send buffer, autotuned to megabytes: ``TCP_NOTSENT_LOWAT`` makes the socket take more only
  while less than :data:`NOTSENT_LOWAT_BYTES` of what it holds is not sent yet (what is sent and not yet
  acknowledged does not count: the cable stays full);
- the transport's write buffer in user space (asyncio or uvloop: 64 KiB before the protocol is asked to
  wait): its limits are set to :data:`WRITE_BUFFER_HIGH_BYTES`, so what the kernel does not take at once
  makes the writer wait until it took it all. Each end's WebSocket library waits only at times of its own,
  so each is made to wait after every message:

  - the opener's end, aiohttp: its WebSocket writer waits for the transport only once it wrote ``_limit``
    bytes (64 KiB) since it last did; the limit is set to :data:`AIOHTTP_WAIT_AFTER_BYTES`;
  - the site's end, uvicorn's websockets-sansio protocol: its ASGI ``send`` waits for the transport before a
    write, not after; :meth:`Pacing.wait_drained` waits on the protocol's ``writable`` event after one.

These are the libraries' internals, each looked up with a fallback: what is not found is not applied, and
the link works as without pacing (tests on real sockets say when a library's new version moved one):

- aiohttp: ``ClientWebSocketResponse._writer``, its ``transport`` and ``_limit``;
- uvicorn: starlette's ``WebSocket._send`` is the ASGI ``send`` callable, within closures of starlette's
  own: uvicorn's is a bound method of the connection's protocol, which has ``transport`` and ``writable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# What the kernel holds of a link that is not sent yet, at most (about: it takes a write while below).
NOTSENT_LOWAT_BYTES = 16 * 1024
# The user-space write buffer's high water mark: anything the kernel did not take makes the writer wait.
WRITE_BUFFER_HIGH_BYTES = 0
# aiohttp's WebSocket writer waits for the transport once it wrote more than this since it last did: after
# every part, but not after a pong alone (its reader answers pings, and would wait for the writer's part).
AIOHTTP_WAIT_AFTER_BYTES = 4 * 1024
# The socket module has no name for it on some builds; 25 is Linux's.
TCP_NOTSENT_LOWAT: int | None = getattr(
    socket, "TCP_NOTSENT_LOWAT", 25 if sys.platform.startswith("linux") else None
)
# Callables looked into for uvicorn's send, at most (starlette wraps it once or twice).
_LOOK_AT_MOST = 32


@dataclass
class Pacing:
    """What was applied to one end of a link: the kernel's limit of unsent bytes, the small write buffer,
    and a writer that waits for the transport after every message; and the transport found (None: none)."""

    transport: asyncio.Transport | None = None
    notsent_lowat: bool = False
    small_buffer: bool = False
    waits_each_message: bool = False
    # Waits until the transport took all that was written (None: the library's send does it).
    drained: Callable[[], Awaitable[Any]] | None = None

    @property
    def applied(self) -> bool:
        return self.notsent_lowat and self.small_buffer and self.waits_each_message

    async def wait_drained(self) -> None:
        """Return once the transport below took all that was written."""
        if self.drained is not None:
            await self.drained()


def pace_client(ws: object) -> Pacing:
    """Pace the opener's end of a link, an aiohttp ``ClientWebSocketResponse``."""
    writer = getattr(ws, "_writer", None)
    transport = _transport(getattr(writer, "transport", None))
    pacing = Pacing(transport, _notsent_lowat(transport), _small_buffer(transport))
    if isinstance(getattr(writer, "_limit", None), int):
        writer._limit = AIOHTTP_WAIT_AFTER_BYTES  # type: ignore[union-attr]
        pacing.waits_each_message = True
    return pacing


def pace_server(websocket: object) -> Pacing:
    """Pace the site's end of a link, a starlette ``WebSocket`` served by uvicorn."""
    protocol = _asgi_protocol(getattr(websocket, "_send", None))
    transport = _transport(getattr(protocol, "transport", None))
    pacing = Pacing(transport, _notsent_lowat(transport), _small_buffer(transport))
    writable = getattr(protocol, "writable", None)
    if isinstance(writable, asyncio.Event):
        pacing.drained = writable.wait
        pacing.waits_each_message = True
    return pacing


def _asgi_protocol(send: object) -> object | None:
    """The uvicorn protocol whose bound method ``send`` is, or is wrapped by ``send`` (in closures or
    ``functools.partial``); None if there is none."""
    todo: deque[object] = deque([send])
    looked = 0
    while todo and looked < _LOOK_AT_MOST:
        candidate = todo.popleft()
        looked += 1
        owner: object = getattr(candidate, "__self__", None)
        if owner is not None and _transport(getattr(owner, "transport", None)) is not None:
            return owner
        inner = getattr(candidate, "func", None)
        if callable(inner):
            todo.append(inner)
        for cell in getattr(candidate, "__closure__", None) or ():
            # An empty cell (a variable not bound yet) raises ValueError.
            with contextlib.suppress(ValueError):
                if callable(cell.cell_contents):
                    todo.append(cell.cell_contents)
    return None


def _transport(candidate: object) -> asyncio.Transport | None:
    if callable(getattr(candidate, "set_write_buffer_limits", None)) and callable(
        getattr(candidate, "get_extra_info", None)
    ):
        return candidate  # type: ignore[return-value]
    return None


def _notsent_lowat(transport: asyncio.Transport | None) -> bool:
    if transport is None or TCP_NOTSENT_LOWAT is None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
    except (OSError, AttributeError):
        return False
    return True


def _small_buffer(transport: asyncio.Transport | None) -> bool:
    if transport is None:
        return False
    try:
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=0)
    except (NotImplementedError, ValueError, RuntimeError, AttributeError):
        return False
    return True
