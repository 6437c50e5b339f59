"""The site's end of a link, on a real uvicorn as the daemon serves its port: the upgrade (404 elsewhere,
links let begin at a bounded rate), WebSocket as the link reads it (fragments put together, a slow reader
makes the connection wait, pings answered, close codes told), the kernel's keepalive, and links closed when
the server stops."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from websockets.asyncio.client import connect
from websockets.server import ServerProtocol

from msgbusd.link.link_admission import RETRY_AFTER, LinkAdmission
from msgbusd.link.link_keepalive import SITE_KEEPALIVE
from msgbusd.link.link_sockets import RETIRED
from msgbusd.link.site_socket import LINK_PATH, SiteSocket, SiteSocketSettings
from tests.link.link_pair import TIMEOUT_S, site_port

pytestmark = pytest.mark.timeout(60)

MAX_BYTES = 64 * 1024


class Sockets:
    """The sockets of the links opened to a site port, as they begin; each is held until released."""

    def __init__(self) -> None:
        self.begun: asyncio.Queue[SiteSocket] = asyncio.Queue()
        self.release = asyncio.Event()

    async def serve(self, sock: SiteSocket) -> None:
        self.begun.put_nowait(sock)
        await self.release.wait()

    async def next(self) -> SiteSocket:
        return await asyncio.wait_for(self.begun.get(), TIMEOUT_S)


@asynccontextmanager
async def serving(
    admission: LinkAdmission | None = None, *, takes_links: bool = True
) -> AsyncIterator[tuple[str, Sockets]]:
    sockets = Sockets()
    settings = SiteSocketSettings(
        sockets.serve if takes_links else None, max_message_bytes=MAX_BYTES, admission=admission
    )
    async with site_port(sockets.serve, settings) as url:
        try:
            yield url, sockets
        finally:
            sockets.release.set()


async def upgrade_status(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
    """101, or the status the upgrade was answered, and its Retry-After."""
    try:
        ws = await session.ws_connect(url, autoping=False)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status, exc.headers.get(RETRY_AFTER) if exc.headers is not None else None
    await ws.close()
    return 101, None


async def test_an_upgrade_elsewhere_and_any_upgrade_to_a_site_without_links_is_answered_404() -> None:
    async with aiohttp.ClientSession() as session:
        async with serving() as (url, _):
            assert await upgrade_status(session, url.replace(LINK_PATH, "/elsewhere")) == (404, None)
            assert (await upgrade_status(session, url))[0] == 101
        async with serving(takes_links=False) as (url, _):
            assert await upgrade_status(session, url) == (404, None)


async def test_upgrades_beyond_the_rate_wait_their_turn_or_are_told_when_to_dial_again() -> None:
    # One at once, then one every half second; a turn at most a second away is waited for.
    admission = LinkAdmission(2.0, burst=1, max_wait_s=1.0)
    async with aiohttp.ClientSession() as session, serving(admission) as (url, sockets):
        answers = await asyncio.gather(*(upgrade_status(session, url) for _ in range(5)))
        statuses = sorted(status for status, _ in answers)
        assert statuses == [101, 101, 101, 503, 503], answers
        assert admission.waited == 2 and admission.turned_away == 2
        told = sorted(int(retry_after) for status, retry_after in answers if retry_after is not None)
        # Beyond the second waited for, one turn after the other (in whole seconds, rounded down: the
        # dialer adds up to one of its own).
        assert told[0] >= 1 and told[1] - told[0] in (0, 1), told
        for _ in range(3):
            await sockets.next()


async def test_messages_come_whole_and_in_order_to_a_reader_that_takes_its_time() -> None:
    async with serving() as (url, sockets), connect(url, compression=None) as client:
        # A message in fragments, then more messages than the site reads ahead, before it reads any.
        await client.send([b"frag", b"ments"])
        for n in range(50):
            await client.send(b"%d" % n)
        site = await sockets.next()
        received = [await site.receive() for _ in range(51)]
        assert received == [b"fragments", *(b"%d" % n for n in range(50))]
        await site.send(b"back")
        assert await client.recv() == b"back"


async def test_a_ping_is_answered_and_the_peers_close_is_told_with_its_code() -> None:
    async with aiohttp.ClientSession() as session, serving() as (url, sockets):
        ws = await session.ws_connect(url, autoping=False)
        site = await sockets.next()
        await ws.ping(b"are you there")
        pong = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"are you there")
        await ws.close(code=RETIRED, message=b"idle")
        assert await site.receive() is None
        assert site.retired()
        assert site.close_reason() == f"closed by the peer ({RETIRED} idle)"


async def test_a_message_over_the_limit_closes_the_link_with_1009() -> None:
    async with aiohttp.ClientSession() as session, serving() as (url, sockets):
        ws = await session.ws_connect(url, autoping=False)
        site = await sockets.next()
        await ws.send_bytes(b"x" * (MAX_BYTES + 1))
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1009)
        assert await site.receive() is None
        assert site.close_reason().endswith("exceeds limit of 65536 bytes"), site.close_reason()


async def test_the_site_end_has_the_kernel_check_its_connection() -> None:
    async with aiohttp.ClientSession() as session, serving() as (url, sockets):
        await session.ws_connect(url, autoping=False)
        site = await sockets.next()
        assert site.pacing.transport is not None
        sock = site.pacing.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == SITE_KEEPALIVE.idle_s
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == SITE_KEEPALIVE.interval_s
        user_timeout_ms = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        assert user_timeout_ms == int(SITE_KEEPALIVE.dead_after_s * 1000)


async def test_a_server_that_stops_closes_its_links_as_going_away() -> None:
    ended: asyncio.Queue[str] = asyncio.Queue()

    async def read_to_the_end(sock: SiteSocket) -> None:
        while await sock.receive() is not None:
            pass
        ended.put_nowait(sock.close_reason())

    async with aiohttp.ClientSession() as session:
        async with site_port(read_to_the_end) as url:
            ws = await session.ws_connect(url, autoping=False)
        closing = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1001)
        assert closing.extra == "the site is stopping"
        assert await asyncio.wait_for(ended.get(), TIMEOUT_S) == "the site is stopping"


async def test_connections_upgraded_or_turned_away_leave_nothing_for_the_cyclic_collector() -> None:
    """What a link's connection held is freed as soon as it closes (by reference counts): a cloud site
    collects its oldest objects seldom, and ten thousand edges come and go."""
    gc.collect()
    gc.disable()
    try:
        admission = LinkAdmission(1000.0, burst=10, max_wait_s=0.0)
        async with aiohttp.ClientSession() as session, serving(admission) as (url, sockets):
            for _ in range(10):
                ws = await session.ws_connect(url, autoping=False)
                await ws.close()
                assert await (await sockets.next()).receive() is None
            answers = await asyncio.gather(*(upgrade_status(session, url) for _ in range(30)))
            assert 503 in {status for status, _ in answers}, "some turned away"
            assert await upgrade_status(session, url.replace(LINK_PATH, "/elsewhere")) == (404, None)
            for _ in range(sum(1 for status, _ in answers if status == 101)):
                await sockets.next()
        left = [
            type(o).__name__
            for o in gc.get_objects()
            if isinstance(o, SiteSocket | ServerProtocol) or type(o).__name__ == "HttpToolsProtocol"
        ]
        assert left == []
    finally:
        gc.enable()
