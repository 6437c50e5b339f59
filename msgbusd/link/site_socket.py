"""The site's end of a link: the connection itself, as uvicorn hands it over for a WebSocket upgrade,
speaking WebSocket with the ``websockets`` library's sans-I/O protocol straight to the link
(:mod:`msgbusd.link.links`).

uvicorn serves the site port (the RMB endpoints, status, metrics) and gives each HTTP/1.1 upgrade to
WebSocket to the protocol class of its ``ws`` setting, with the connection as it is. :func:`site_sockets`
makes that class: for ``/zbus-link`` it answers the upgrade and runs the link on the connection, with no
ASGI application, no task or queue of uvicorn's and no starlette in between. A link so costs a cloud site
about a third of the memory it did (a WebSocket of uvicorn's and starlette's alone took about 25 KiB), and
each frame fewer steps. Any other upgrade is answered 404.

It is also where the site turns away links beyond the rate it takes them
(:mod:`msgbusd.link.link_admission`), before any of the handshake's work is done, and where the kernel's
keepalive is set on the connection (:mod:`msgbusd.link.link_keepalive`): the site's end sends no pings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from msgbusd.link.link_admission import BUSY_STATUS, RETRY_AFTER, LinkAdmission, Turn, retry_after_header
from msgbusd.link.link_keepalive import SITE_KEEPALIVE, Keepalive
from msgbusd.link.link_pacing import Pacing, pace_transport
from msgbusd.link.link_sockets import RETIRED, LinkClosed

log = logging.getLogger("msgbusd.links")
# websockets says every connection opened and closed at INFO.
_PROTOCOL_LOG = logging.getLogger("msgbusd.links.websocket")
_PROTOCOL_LOG.setLevel(logging.WARNING)

LINK_PATH = "/zbus-link"
# Messages read and not yet taken by the link, at most: beyond, the connection is not read until it took some.
READ_AHEAD = 8
# A link closed here waits this long for the peer's close frame before the connection is cut.
CLOSE_TIMEOUT_S = 5.0
# The longest close reason a close frame carries (123 bytes, in UTF-8).
_REASON_BYTES = 120

Serve = Callable[["SiteSocket"], Awaitable[None]]


@dataclass(frozen=True)
class SiteSocketSettings:
    """What the site's links are: ``serve`` runs each one (None: this site takes no links, every upgrade is
    answered 404), ``max_message_bytes`` is the largest message a peer may send, ``admission`` lets links
    begin at a bounded rate (None: all at once), ``keepalive`` are the kernel's checks of the connection."""

    serve: Serve | None
    max_message_bytes: int
    admission: LinkAdmission | None = None
    keepalive: Keepalive | None = SITE_KEEPALIVE


def site_sockets(settings: SiteSocketSettings) -> type[SiteSocket]:
    """The protocol class for uvicorn's ``ws`` setting that serves the site's links so."""

    class Configured(SiteSocket):
        _settings = settings

    return Configured


class SiteSocket(asyncio.Protocol):
    """One upgraded connection of the site port; once its upgrade to ``/zbus-link`` is taken, the socket of
    the link on it (:class:`~msgbusd.link.link_sockets.Socket`)."""

    _settings: ClassVar[SiteSocketSettings] = SiteSocketSettings(None, 0)

    def __init__(self, config: object = None, server_state: Any = None, app_state: object = None) -> None:
        # uvicorn's: every connection in it is shut down (:meth:`shutdown`) when the server stops, and the
        # server waits for its tasks.
        self._server_state = server_state
        self._ws = ServerProtocol(max_size=self._settings.max_message_bytes, logger=_PROTOCOL_LOG)
        self._transport: asyncio.Transport | None = None
        self.pacing = Pacing()
        self._received: list[bytes] = []
        self._fragments: list[bytes] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        # No more messages come: the peer closed, the connection was lost, or this end closed it.
        self._ended = False
        self._lost = False
        self._reason = ""
        self._code: int | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        # An upgrade waiting for its turn (:mod:`msgbusd.link.link_admission`).
        self._turn: asyncio.TimerHandle | None = None

    # --- the connection, as the event loop calls it --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an asyncio.Transport by class, only by what it does.
        transport = cast(asyncio.Transport, transport)
        self._release(transport.get_protocol())
        self._transport = transport
        if self._server_state is not None:
            self._server_state.connections.add(self)
        self.pacing = pace_transport(transport)
        # This end waits for the transport after each message it writes (:meth:`send`).
        self.pacing.waits_each_message = True
        if self._settings.keepalive is not None:
            self._settings.keepalive.apply_to(transport)

    def _release(self, handed_over: asyncio.BaseProtocol) -> None:
        """Break the cycle of uvicorn's HTTP protocol that hands the connection over: its parser refers back
        to it, and uvicorn lets go of its parser only when the connection is lost to it, which an upgraded one
        never is. Left, each would wait for the collector's walk of its oldest generation (which a busy
        cloud site does seldom: ten thousand of them after a herd of edges)."""
        if handed_over is not self and getattr(handed_over, "parser", None) is not None:
            handed_over.parser = None  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self._ws.receive_data(data)
        self._take_events()

    def eof_received(self) -> bool | None:
        # The transport closes, and connection_lost says why. Not told to the protocol: its parser would end
        # with an exception whose traceback refers back to it, a cycle that waits for the collector's walk
        # of its oldest generation (every upgrade turned away made one).
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        # What refers back to what refers to it is let go of, so that the connection's objects are freed as
        # soon as it closes rather than at the collector's walk of its oldest generation: the transport
        # refers to this protocol, and the WebSocket protocol to its parser, a generator that refers to it.
        self._transport = None
        self.pacing = Pacing()
        self._ws.parser.close()
        if not self._reason:
            self._reason = f"failed: {exc}" if exc is not None else "closed by the peer"
        self._end()
        for timer in (self._close_timer, self._turn):
            if timer is not None:
                timer.cancel()
        self._close_timer = self._turn = None
        self._wake_drained()
        if self._server_state is not None:
            self._server_state.connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drained()

    def shutdown(self) -> None:
        """uvicorn stops serving: the link is closed (its peer sends what it carried again on its next)."""
        self._close(1001, "the site is stopping")

    # --- the link's socket ---------------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write one binary message; returns once the kernel took it (the link's writer picks the next one
        only then: :mod:`msgbusd.link.link_pacing`)."""
        if self._ended or self._ws.state is not State.OPEN:
            raise LinkClosed(self.close_reason())
        self._ws.send_binary(data)
        self._flush()
        while self._writing_paused and not self._lost:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def receive(self) -> bytes | None:
        """The next message, or None once the link is closed."""
        while not self._received:
            if self._ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._received.pop(0)
        if self._reading_paused and len(self._received) < READ_AHEAD // 2 and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        return data

    async def close(self, code: int, reason: str) -> None:
        self._close(code, reason)

    def close_reason(self) -> str:
        return (self._reason or "closed").strip()

    def refused(self) -> bool:
        return False

    def retired(self) -> bool:
        return self._code == RETIRED

    # --- inside -------------------------------------------------------------------------------------------

    def _take_events(self) -> None:
        for event in self._ws.events_received():
            if isinstance(event, Request):
                self._upgrade(event)
            elif isinstance(event, Frame):
                self._frame(event)
        if self._ws.parser_exc is not None and not self._reason:
            self._reason = f"failed: {self._ws.parser_exc}"
            self._end()
        self._flush()

    def _upgrade(self, request: Request) -> None:
        settings = self._settings
        path = request.path.partition("?")[0]
        if settings.serve is None or path != LINK_PATH:
            what = "this site takes no links" if settings.serve is None else "no such WebSocket here"
            self._answer(self._ws.reject(404, f"{what}\n"))
            return
        turn = settings.admission.admit() if settings.admission is not None else Turn(0.0)
        if turn.wait_s is None:
            assert settings.admission is not None
            response = self._ws.reject(
                BUSY_STATUS,
                f"this site lets {settings.admission.rate_per_s:g} links begin a second and more are "
                f"coming: dial again in {turn.retry_after_s:.1f}s\n",
            )
            response.headers[RETRY_AFTER] = retry_after_header(turn.retry_after_s)
            self._answer(response)
        elif turn.wait_s > 0:
            self._turn = asyncio.get_running_loop().call_later(turn.wait_s, self._take, request)
        else:
            self._take(request)

    def _take(self, request: Request) -> None:
        """The upgrade's turn came: it is answered, and the link begins on the connection."""
        self._turn = None
        if self._lost or self._ended:
            return
        self._answer(self._ws.accept(request))
        self._flush()

    def _answer(self, response: Response) -> None:
        settings = self._settings
        self._ws.send_response(response)
        if response.status_code != 101:
            self._ended = True
            return
        task = asyncio.get_running_loop().create_task(self._serve(settings.serve))
        if self._server_state is not None:
            self._server_state.tasks.add(task)
            task.add_done_callback(self._server_state.tasks.discard)

    async def _serve(self, serve: Serve | None) -> None:
        assert serve is not None
        try:
            await serve(self)
        except Exception:
            log.exception("serving a link failed")
            self._close(1011, "the site failed to serve the link")
        finally:
            self._close(1000, "the link ended")

    def _frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.BINARY or opcode is Opcode.TEXT:
            if frame.fin:
                self._deliver(bytes(frame.data))
            else:
                self._fragments = [bytes(frame.data)]
        elif opcode is Opcode.CONT:
            if self._fragments is not None:
                self._fragments.append(bytes(frame.data))
                if frame.fin:
                    whole, self._fragments = b"".join(self._fragments), None
                    self._deliver(whole)
        elif opcode is Opcode.CLOSE:
            close = self._ws.close_rcvd
            if close is not None:
                self._code = int(close.code)
                self._reason = self._reason or f"closed by the peer ({close.code} {close.reason})"
            self._end()
        # A ping's pong is queued by the protocol itself; a pong needs nothing.

    def _deliver(self, data: bytes) -> None:
        if self._ended:
            return
        self._received.append(data)
        self._wake_reader()
        if len(self._received) >= READ_AHEAD and not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _close(self, code: int, reason: str) -> None:
        if not self._reason:
            self._reason = reason
        self._received.clear()
        self._end()
        transport = self._transport
        if transport is None or self._lost:
            return
        if self._ws.state is State.OPEN:
            self._ws.send_close(code, reason.encode()[:_REASON_BYTES].decode(errors="ignore"))
            self._flush()
            if self._close_timer is None and not transport.is_closing():
                self._close_timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, transport.abort)
        elif self._ws.state is not State.CLOSING and not transport.is_closing():
            transport.close()

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        for data in self._ws.data_to_send():
            if data:
                if not transport.is_closing():
                    transport.write(data)
            else:
                # The protocol is done with the connection (after a close frame each way, or an answer
                # other than 101): what was written goes first.
                transport.close()

    def _end(self) -> None:
        self._ended = True
        self._wake_reader()

    def _wake_reader(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _wake_drained(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
