"""The two ends of a link on loopback, in this process: the opener's over aiohttp as ``Links`` opens it, the
site's over uvicorn and the site's own socket as the daemon serves it, each a :class:`Link` with a
:class:`Recorder` in front of its socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import uvloop
from starlette.applications import Starlette

from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_parts import FIRST, LAST, is_part
from msgbusd.link.link_sockets import ClientSocket, Socket
from msgbusd.link.open_link import Answer, Link
from msgbusd.link.site_socket import LINK_PATH, SiteSocket, SiteSocketSettings, site_sockets
from msgbusd.site.serving import bind_socket, server
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES, envelope_size_limit

T = TypeVar("T")

PING_S = 5.0
TIMEOUT_S = 20.0
MAX_BYTES = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES)
OPENER, SITE = 1, 2
# An envelope that starts so is answered with a refusal whose text is this long (its ack is large).
LONG_REFUSAL = "refuse-long:"
REFUSAL_CHARS = 40_000
# The event loops a daemon may run on.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run_on(loop: str, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a fresh event loop of the kind ``loop`` (a key of :data:`LOOPS`)."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(main)


def message(envelope: str) -> bytes:
    """A message of a ``send`` frame whose envelope is the JSON string ``envelope``."""
    return orjson.dumps({"path": "/zbus-remote", "envelope": envelope})


def describe(data: bytes) -> tuple[Any, ...]:
    """What a message on a link is: ``("part", part id, first, last, slice size)``, or
    ``(op, frame id, size)``."""
    if is_part(data):
        part_id = int.from_bytes(data[2:10], "big")
        return ("part", part_id, bool(data[1] & FIRST), bool(data[1] & LAST), len(data) - 10)
    frame = orjson.loads(data)
    return (frame["op"], frame.get("id"), len(data))


class Recorder:
    """A socket in front of another that notes what goes each way (:func:`describe`), and holds back the
    parts written after the first ``let_through`` ones while ``hold`` is not set, and stops reading while
    ``hold_reading`` is not set."""

    def __init__(self, inner: Socket, changed: asyncio.Event) -> None:
        self.inner = inner
        self.sent: list[tuple[Any, ...]] = []
        self.received: list[tuple[Any, ...]] = []
        self.hold: asyncio.Event | None = None
        self.hold_reading: asyncio.Event | None = None
        self.let_through = 1
        self._parts_sent = 0
        self._changed = changed

    async def send(self, data: bytes) -> None:
        if self.hold is not None and is_part(data) and self._parts_sent >= self.let_through:
            await self.hold.wait()
        await self.inner.send(data)
        self._parts_sent += is_part(data)
        self.sent.append(describe(data))
        self._changed.set()

    def release(self) -> None:
        """Hold nothing back any more."""
        for held in (self.hold, self.hold_reading):
            if held is not None:
                held.set()

    async def receive(self) -> bytes | None:
        if self.hold_reading is not None:
            await self.hold_reading.wait()
        data = await self.inner.receive()
        if data is not None:
            self.received.append(describe(data))
            self._changed.set()
        return data

    async def close(self, code: int, reason: str) -> None:
        await self.inner.close(code, reason)

    def close_reason(self) -> str:
        return self.inner.close_reason()

    def refused(self) -> bool:
        return self.inner.refused()

    def retired(self) -> bool:
        return self.inner.retired()


@dataclass
class Pair:
    """Both ends of one link, and what each answered (``(end, envelope)``, in order)."""

    opener: Link
    site: Link
    at_opener: Recorder
    at_site: Recorder
    opener_socket: ClientSocket
    site_socket: SiteSocket
    # The opener's reader: done once the link closed at the opener's end.
    reading: asyncio.Future[None]
    answered: list[tuple[int, str]]
    changed: asyncio.Event

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait until ``condition`` holds (checked whenever something went over the link or was answered)."""
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while not condition():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"waited {TIMEOUT_S:g}s in vain for {what}") from None


def answerer(end: int, answered: list[tuple[int, str]], changed: asyncio.Event) -> Answer:
    """How an end answers: it notes every envelope, refuses those that ask for it with a long text, and takes
    the others."""

    async def answer(peer: int, messages: list[Any], through_relay: bool) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for item in messages:
            envelope = str(item["envelope"])
            answered.append((end, envelope))
            if envelope.startswith(LONG_REFUSAL):
                results.append({"status": 400, "message": "x" * REFUSAL_CHARS})
            else:
                results.append({"status": 200})
        changed.set()
        return results

    return answer


@asynccontextmanager
async def site_port(
    endpoint: Callable[[SiteSocket], Awaitable[None]], settings: SiteSocketSettings | None = None
) -> AsyncIterator[str]:
    """The URL of ``/zbus-link`` on a port served as the daemon serves its own, by ``endpoint`` (with
    ``settings`` rather than the daemon's, if given)."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    quiet = server(
        Starlette(),
        1.0,
        ws=site_sockets(settings or SiteSocketSettings(endpoint, max_message_bytes=MAX_BYTES + 4096)),
    )
    serving = asyncio.ensure_future(quiet.serve(sockets=[sock]))
    try:
        yield f"ws://127.0.0.1:{port}{LINK_PATH}"
    finally:
        quiet.should_exit = True
        await serving
        sock.close()


class Site:
    """A site port whose ``/zbus-link`` makes a :class:`Link` of every link opened to it."""

    def __init__(self, *, opener_reads_parts: bool, max_bytes: int) -> None:
        self.url = ""
        self._opener_reads_parts = opener_reads_parts
        self._max_bytes = max_bytes
        self._ends: asyncio.Queue[tuple[Link, Recorder, SiteSocket]] = asyncio.Queue()
        self._answered: list[tuple[int, str]] = []
        self._changed = asyncio.Event()
        self._ended: list[asyncio.Event] = []
        self._recorders: list[Recorder] = []

    async def endpoint(self, sock: SiteSocket) -> None:
        recorder = Recorder(sock, self._changed)
        self._recorders.append(recorder)
        link = Link(
            OPENER,
            recorder,
            answerer(SITE, self._answered, self._changed),
            opened_here=False,
            peer_max_bytes=MAX_BYTES,
            peer_reads_parts=self._opener_reads_parts,
            max_bytes=self._max_bytes,
        )
        self._ended.append(link.ended)
        self._ends.put_nowait((link, recorder, sock))
        try:
            await link.run()
        finally:
            link.mark_ended()

    @asynccontextmanager
    async def link(self, *, site_reads_parts: bool = True) -> AsyncIterator[Pair]:
        """A link opened to this site, as ``Links`` opens one."""
        self._answered = []
        self._changed = asyncio.Event()
        http = HttpClients(TIMEOUT_S)
        try:
            ws = await http.websocket(self.url, max_message_bytes=MAX_BYTES + 4096, timeout_s=TIMEOUT_S)
            opener_socket = ClientSocket(ws)
            at_opener = Recorder(opener_socket, self._changed)
            self._recorders.append(at_opener)
            opener = Link(
                SITE,
                at_opener,
                answerer(OPENER, self._answered, self._changed),
                opened_here=True,
                peer_max_bytes=self._max_bytes,
                peer_reads_parts=site_reads_parts,
            )
            reading = asyncio.ensure_future(opener.run())
            try:
                site, at_site, site_socket = await asyncio.wait_for(self._ends.get(), TIMEOUT_S)
                yield Pair(
                    opener,
                    site,
                    at_opener,
                    at_site,
                    opener_socket,
                    site_socket,
                    reading,
                    self._answered,
                    self._changed,
                )
            finally:
                for recorder in self._recorders:
                    recorder.release()
                await opener.close("the test is over")
                with suppress(asyncio.CancelledError):
                    await reading
                for ended in self._ended:
                    await asyncio.wait_for(ended.wait(), TIMEOUT_S)
        finally:
            await http.aclose()


@asynccontextmanager
async def serving_site(*, opener_reads_parts: bool = True, max_bytes: int = MAX_BYTES) -> AsyncIterator[Site]:
    """A site that takes frames of ``max_bytes`` at most, and takes its openers to read parts unless told."""
    site = Site(opener_reads_parts=opener_reads_parts, max_bytes=max_bytes)
    async with site_port(site.endpoint) as url:
        site.url = url
        yield site


@asynccontextmanager
async def link_pair(*, opener_reads_parts: bool = True, site_reads_parts: bool = True) -> AsyncIterator[Pair]:
    """A link from an opener to a site, both of this version unless told that an end does not read parts."""
    async with (
        serving_site(opener_reads_parts=opener_reads_parts) as site,
        site.link(site_reads_parts=site_reads_parts) as pair,
    ):
        yield pair
