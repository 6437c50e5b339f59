"""Pacing a link's connection: what waits below the link's writer (:mod:`msgbusd.link.link_writer`) is kept
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
  - the site's end (:mod:`msgbusd.link.site_socket`) is the connection's protocol itself: it waits for
    the transport after each message it writes.

The opener's are aiohttp's internals, looked up with a fallback: what is not found is not applied, and the
link works as without pacing (tests on real sockets say when a new version moved one):
``ClientWebSocketResponse._writer``, its ``transport`` and ``_limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# What the kernel holds of a link that is not sent yet, at most (about: it takes a write while below); on a
# cable measured slow, as much as a part (FairWriter's limit_unsent).
NOTSENT_LOWAT_BYTES = 16 * 1024
# The user-space write buffer's high water mark: anything the kernel did not take makes the writer wait.
WRITE_BUFFER_HIGH_BYTES = 0
# aiohttp's WebSocket writer waits for the transport once it wrote more than this since it last did: after
# every part, but not after a pong alone (its reader answers pings, and would wait for the writer's part).
AIOHTTP_WAIT_AFTER_BYTES = 4 * 1024
# Linux's ioctl for the bytes of a TCP socket not sent yet.
SIOCOUTQNSD: int | None = 0x894B if sys.platform.startswith("linux") else None
# The socket module has no name for it on some builds; 25 is Linux's.
TCP_NOTSENT_LOWAT: int | None = getattr(
    socket, "TCP_NOTSENT_LOWAT", 25 if sys.platform.startswith("linux") else None
)


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

    def unsent_bytes(self) -> int | None:
        """What the kernel holds of this connection that is not sent yet (None: it cannot say). A write the
        socket's buffer has room for is taken whatever ``TCP_NOTSENT_LOWAT`` says (that limit only delays
        the socket's being reported writable), so a writer that wants little unsent asks."""
        if self.transport is None or SIOCOUTQNSD is None:
            return None
        sock = self.transport.get_extra_info("socket")
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
        except (OSError, AttributeError, ValueError):
            return None
        return int.from_bytes(answer, sys.byteorder, signed=True)

    def limit_unsent(self, size: int) -> None:
        """Let the kernel hold about ``size`` bytes unsent instead (a part: on a slow cable
        :data:`NOTSENT_LOWAT_BYTES` is a quarter of a second); nothing where no limit was applied."""
        if self.notsent_lowat and self.transport is not None:
            sock = self.transport.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, size)

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


def pace_transport(transport: asyncio.Transport) -> Pacing:
    """Pace a connection whose writer waits for the transport itself (the site's end of a link): the
    kernel's limit and the small write buffer."""
    return Pacing(transport, _notsent_lowat(transport), _small_buffer(transport))


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
