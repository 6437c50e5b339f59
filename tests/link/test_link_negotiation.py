"""Whether a site is written parts is said in the link's handshake: sites of this version say they read parts
and are written parts; an older site or opener, which does not say so (and ignores what the other says), is
written whole frames, and everything still goes both ways."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from msgbusd.identity.signing import Signer
from msgbusd.link.handshake import handshake_digest
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_admission import LinkAdmission
from msgbusd.link.link_parts import PART_BYTES
from msgbusd.link.link_sockets import ClientSocket
from msgbusd.link.links import Links
from msgbusd.link.open_link import Link, Result
from msgbusd.link.site_socket import SiteSocket, SiteSocketSettings
from tests.link.link_pair import (
    MAX_BYTES,
    OPENER,
    PING_S,
    SITE,
    TIMEOUT_S,
    Recorder,
    answerer,
    message,
    site_port,
)
from twin_resolver.base import Twin
from twin_resolver.static import StaticResolver

pytestmark = pytest.mark.timeout(60)

LARGE = "x" * (8 * PART_BYTES)
KEYS = {OPENER: Signer(b"\x01" * 32, "ed25519"), SITE: Signer(b"\x02" * 32, "ed25519")}


class Sites:
    """An opener's and a site's ``Links``, of this version, over a site port whose ``/zbus-link`` is
    ``Links.serve`` unless an older site's is given."""

    def __init__(self) -> None:
        self.answered: list[tuple[int, str]] = []
        self.changed = asyncio.Event()
        self.http = HttpClients(TIMEOUT_S)
        self.opener: Links | None = None
        self.site: Links | None = None

    def links(self, twin: int, resolver: StaticResolver) -> Links:
        return Links(
            twin,
            KEYS[twin],
            resolver,
            self.http,
            answerer(twin, self.answered, self.changed),
            timeout_s=TIMEOUT_S,
            ping_s=PING_S,
            max_frame_bytes=MAX_BYTES,
        )

    async def serve(self, socket: SiteSocket) -> None:
        assert self.site is not None
        await self.site.serve(socket)


@asynccontextmanager
async def sites(
    older_site: Any = None, admission: LinkAdmission | None = None
) -> AsyncIterator[tuple[Sites, str]]:
    """Both sites, and the URL of the site's ``/zbus-link``; ``older_site`` serves it instead if given, and
    ``admission`` lets its links begin."""
    both = Sites()
    serve = older_site or both.serve
    async with site_port(serve, SiteSocketSettings(serve, MAX_BYTES + 4096, admission)) as url:
        twins = [
            Twin(id=OPENER, address="127.0.0.1:1", public_key=KEYS[OPENER].public_key),
            Twin(id=SITE, address=urlsplit(url).netloc, public_key=KEYS[SITE].public_key),
        ]
        resolver = StaticResolver.from_twins(twins)
        both.opener, both.site = both.links(OPENER, resolver), both.links(SITE, resolver)
        try:
            yield both, url
        finally:
            await both.opener.aclose()
            await both.site.aclose()
            await both.http.aclose()


def frames(recorder: Recorder) -> list[object]:
    return [what[0] for what in recorder.received]


async def test_sites_of_this_version_say_they_read_parts_and_are_written_parts() -> None:
    async with sites() as (both, _):
        assert both.opener is not None and both.site is not None
        link = await both.opener.link_to(SITE)
        assert link is not None and link.peer_reads_parts
        assert await link.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
        their = await both.site.link_to(OPENER, replies_only=True, open_new=False)
        assert their is not None and their.peer_reads_parts
        assert await their.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
        assert both.answered == [(SITE, LARGE), (OPENER, LARGE)]


async def test_an_older_site_is_written_whole_frames() -> None:
    hellos: list[dict[str, Any]] = []
    ends: asyncio.Queue[tuple[Link, Recorder]] = asyncio.Queue()
    answered: list[tuple[int, str]] = []

    async def older_site(socket: SiteSocket) -> None:
        # The handshake of a site from before parts: it says nothing of them, and reads only what it knows.
        sock = Recorder(socket, asyncio.Event())
        nonce = os.urandom(16).hex()
        await sock.send(
            orjson.dumps({"op": "challenge", "twin": SITE, "nonce": nonce, "max_bytes": MAX_BYTES})
        )
        hello = orjson.loads(await sock.receive() or b"{}")
        hellos.append(hello)
        sig = KEYS[SITE].sign_digest(handshake_digest(SITE, int(hello["twin"]), str(hello["nonce"])))
        await sock.send(orjson.dumps({"op": "welcome", "sig": sig.hex()}))
        link = Link(
            OPENER,
            sock,
            answerer(SITE, answered, asyncio.Event()),
            opened_here=False,
            peer_max_bytes=MAX_BYTES,
        )
        ends.put_nowait((link, sock))
        await link.run()

    async with sites(older_site) as (both, _):
        assert both.opener is not None
        link = await both.opener.link_to(SITE)
        assert link is not None and not link.peer_reads_parts
        # This version says it reads parts; the older site takes no notice.
        assert hellos[0]["parts"] is True
        older, at_older = await asyncio.wait_for(ends.get(), TIMEOUT_S)
        assert await link.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
        assert await older.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
        assert answered == [(SITE, LARGE)] and both.answered == [(OPENER, LARGE)]
        assert frames(at_older) == ["hello", "send", "ack"]


async def test_an_older_opener_is_written_whole_frames() -> None:
    async with sites() as (both, url):
        assert both.site is not None
        ws = await both.http.websocket(url, max_message_bytes=MAX_BYTES + 4096, timeout_s=TIMEOUT_S)
        sock = Recorder(ClientSocket(ws), asyncio.Event())
        # The handshake of an opener from before parts.
        challenge = orjson.loads(await sock.receive() or b"{}")
        assert challenge["parts"] is True
        sig = KEYS[OPENER].sign_digest(handshake_digest(OPENER, SITE, str(challenge["nonce"])))
        hello = {"op": "hello", "twin": OPENER, "nonce": os.urandom(16).hex(), "sig": sig.hex()}
        await sock.send(orjson.dumps({**hello, "max_bytes": MAX_BYTES}))
        assert orjson.loads(await sock.receive() or b"{}")["op"] == "welcome"
        answered: list[tuple[int, str]] = []
        older = Link(
            SITE,
            sock,
            answerer(OPENER, answered, asyncio.Event()),
            opened_here=True,
            peer_max_bytes=MAX_BYTES,
        )
        reading = asyncio.ensure_future(older.run())
        try:
            assert await older.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
            their = await both.site.link_to(OPENER, replies_only=True, open_new=False)
            assert their is not None and not their.peer_reads_parts
            assert await their.send([message(LARGE)], TIMEOUT_S) == [Result(200)]
            assert answered == [(OPENER, LARGE)] and both.answered == [(SITE, LARGE)]
            assert frames(sock) == ["challenge", "welcome", "ack", "send"]
        finally:
            await older.close("the test is over")
            with suppress(asyncio.CancelledError):
                await reading
