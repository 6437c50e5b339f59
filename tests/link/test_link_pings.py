"""The opener's pings: a link it opened that carried nothing for a while is pinged (so that a proxy does not
close it for being idle), and one whose pong does not come within as long again is closed, unless the opener
itself was late; a site that lets no more links begin now is dialed again when it says (an uplink) or sent
POSTs meanwhile (any other link)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from msgbusd.link.link_admission import LinkAdmission
from msgbusd.link.links import PING_EVERY_S
from msgbusd.link.open_link import Link
from tests.link.link_pair import MAX_BYTES, SITE, TIMEOUT_S
from tests.link.test_link_negotiation import sites
from tests.link.test_uplink_breaks import as_uplink
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
EVERY_S = 25.0


class QuietSocket:
    """A socket that notes its pings and hears nothing unless told."""

    def __init__(self) -> None:
        self.heard_at = 0.0
        self.pings = 0
        self.closed: tuple[int, str] | None = None
        self._ended = asyncio.Event()

    async def ping(self) -> None:
        self.pings += 1

    async def send(self, data: bytes) -> None:
        pass

    async def receive(self) -> bytes | None:
        await self._ended.wait()
        return None

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)
        self._ended.set()

    def close_reason(self) -> str:
        return self.closed[1] if self.closed else "closed"

    def refused(self) -> bool:
        return False

    def retired(self) -> bool:
        return False


async def no_answer(peer: int, messages: list[Any], through_relay: bool) -> list[dict[str, Any]]:
    return []


def quiet_link() -> tuple[Link, QuietSocket]:
    sock = QuietSocket()
    return Link(SITE, sock, no_answer, opened_here=True, peer_max_bytes=MAX_BYTES), sock


async def test_a_quiet_link_is_pinged_once_and_again_after_its_pong() -> None:
    link, sock = quiet_link()
    await link.keep_alive(EVERY_S - 1, EVERY_S, may_close=True)
    assert sock.pings == 0, "heard from lately"
    await link.keep_alive(EVERY_S, EVERY_S, may_close=True)
    await link.keep_alive(EVERY_S + 5, EVERY_S, may_close=True)
    assert sock.pings == 1, "one ping waits for its pong"
    sock.heard_at = EVERY_S + 6  # the pong
    await link.keep_alive(EVERY_S + 7, EVERY_S, may_close=True)
    assert sock.pings == 1
    await link.keep_alive(2 * EVERY_S + 6, EVERY_S, may_close=True)
    assert sock.pings == 2 and link.is_open


async def test_a_link_whose_pong_does_not_come_is_closed_unless_the_opener_itself_is_late() -> None:
    link, sock = quiet_link()
    await link.keep_alive(EVERY_S, EVERY_S, may_close=True)
    await link.keep_alive(2 * EVERY_S, EVERY_S, may_close=False)
    assert link.is_open, "the pong may be waiting, unread, behind what made this site late"
    await link.keep_alive(2 * EVERY_S + 1, EVERY_S, may_close=True)
    assert not link.is_open and link.closed_reason == f"no pong within {EVERY_S:g}s"
    assert sock.closed is not None


async def test_a_link_this_site_opened_is_pinged_and_the_pong_is_heard() -> None:
    async with sites() as (both, _):
        assert both.opener is not None
        link = await both.opener.link_to(SITE)
        assert link is not None
        sock = link._socket
        heard_before = sock.heard_at  # type: ignore[attr-defined]
        await both.opener.ping_due(time.monotonic() + PING_EVERY_S)
        await wait_for(lambda: sock.heard_at != heard_before, TIMEOUT_S, "the pong")  # type: ignore[attr-defined]
        assert link.is_open


async def test_an_uplink_turned_away_dials_again_when_the_site_says(caplog: pytest.LogCaptureFixture) -> None:
    admission = LinkAdmission(1.0, burst=1, max_wait_s=0.0)
    admission.admit()  # the turn of now is taken: the edge is turned away, told to come back in a second
    async with sites(admission=admission) as (both, _):
        edge = as_uplink(both)
        stopping = asyncio.Event()
        with caplog.at_level(logging.INFO, logger="msgbusd.links"):
            keeping = asyncio.ensure_future(edge.keep_uplinks(stopping))
            try:
                await wait_for(lambda: edge.current(SITE) is not None, TIMEOUT_S, "the uplink")
            finally:
                stopping.set()
                await keeping
                await edge.aclose()
        messages = [(record.levelno, record.getMessage()) for record in caplog.records]
        turned_away = [text for level, text in messages if "lets no more links begin now" in text]
        assert len(turned_away) == 1 and admission.turned_away == 1, messages
        assert not [
            text for level, text in messages if "dialing again in" in text and level >= logging.WARNING
        ]


async def test_a_link_turned_away_leaves_its_messages_to_posts_until_the_site_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = LinkAdmission(1.0, burst=1, max_wait_s=0.0)
    admission.admit()
    async with sites(admission=admission) as (both, _):
        assert both.opener is not None
        with caplog.at_level(logging.INFO, logger="msgbusd.links"):
            assert await both.opener.link_to(SITE) is None
            assert await both.opener.link_to(SITE) is None, "not asked again before its time"
        assert admission.turned_away == 1
        assert any("sending it POSTs meanwhile" in record.getMessage() for record in caplog.records)
