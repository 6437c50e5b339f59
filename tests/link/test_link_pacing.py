"""Both ends of a link are paced, on either event loop the daemon may run: the kernel holds little of it
unsent and the transport little more than a part, so a small frame is not held behind seconds of a large
one. These fail when a new version of aiohttp, uvicorn or uvloop moves what pacing relies on."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct

import pytest

from msgbusd.link.link_pacing import (
    AIOHTTP_WAIT_AFTER_BYTES,
    NOTSENT_LOWAT_BYTES,
    TCP_NOTSENT_LOWAT,
    WRITE_BUFFER_HIGH_BYTES,
    Pacing,
)
from msgbusd.link.link_parts import PART_BYTES
from msgbusd.link.open_link import Result
from tests.link.link_pair import LOOPS, TIMEOUT_S, link_pair, message, run_on

pytestmark = pytest.mark.timeout(60)

# Linux: the bytes a TCP socket holds that are not sent yet.
SIOCOUTQNSD = 0x894B
# A write may go past the mark by one segment the kernel builds (64 KiB at most).
UNSENT_AT_MOST = NOTSENT_LOWAT_BYTES + 64 * 1024
# A part and its WebSocket header (a mask too, from the opener), after what aiohttp writes without waiting.
PART_MESSAGE_AT_MOST = PART_BYTES + 10 + 14 + AIOHTTP_WAIT_AFTER_BYTES


def unsent_bytes(sock: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0" * 4))[0])


def check_applied(pacing: Pacing) -> asyncio.Transport:
    """The transport of a paced end, once checked that all of pacing holds on it."""
    assert pacing.applied, pacing
    assert pacing.transport is not None
    assert pacing.transport.get_write_buffer_limits() == (0, WRITE_BUFFER_HIGH_BYTES)
    sock = pacing.transport.get_extra_info("socket")
    assert TCP_NOTSENT_LOWAT is not None
    assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == NOTSENT_LOWAT_BYTES
    return pacing.transport


@pytest.mark.parametrize("loop", LOOPS)
def test_both_ends_of_a_link_are_paced(loop: str) -> None:
    run_on(loop, both_ends_paced())


async def both_ends_paced() -> None:
    async with link_pair() as pair:
        at_opener = check_applied(pair.opener_socket.pacing)
        at_site = check_applied(pair.site_socket.pacing)
        # The site's end found the transport of this very connection.
        assert at_site.get_extra_info("peername") == at_opener.get_extra_info("sockname")


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("towards", ["site", "opener"])
def test_little_waits_below_the_writer_of_a_link_whose_peer_stopped_reading(loop: str, towards: str) -> None:
    run_on(loop, little_waits_below_the_writer(towards))


async def little_waits_below_the_writer(towards: str) -> None:
    async with link_pair() as pair:
        if towards == "site":
            sender, reader, pacing = pair.opener, pair.at_site, pair.opener_socket.pacing
        else:
            sender, reader, pacing = pair.site, pair.at_opener, pair.site_socket.pacing
        transport = pacing.transport
        assert transport is not None
        reader.hold_reading = asyncio.Event()
        big = asyncio.ensure_future(sender.send([message("x" * 6_000_000)], TIMEOUT_S))
        # Until the kernel took what it could and the writer waits for it (nothing tells when: looked at).
        async with asyncio.timeout(TIMEOUT_S):
            while transport.get_write_buffer_size() == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert transport.get_write_buffer_size() <= PART_MESSAGE_AT_MOST
        assert unsent_bytes(transport.get_extra_info("socket")) <= UNSENT_AT_MOST
        reader.hold_reading.set()
        assert await big == [Result(200)]


@pytest.mark.parametrize("loop", LOOPS)
def test_each_end_tells_what_its_kernel_holds_unsent_and_takes_a_smaller_limit(loop: str) -> None:
    run_on(loop, unsent_told_and_limited())


async def unsent_told_and_limited() -> None:
    async with link_pair() as pair:
        for pacing in (pair.opener_socket.pacing, pair.site_socket.pacing):
            transport = check_applied(pacing)
            sock = transport.get_extra_info("socket")
            assert pacing.unsent_bytes() == unsent_bytes(sock) == 0
            pacing.limit_unsent(4096)
            assert TCP_NOTSENT_LOWAT is not None
            assert sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) == 4096
        # Held back from the cable, the opener's kernel holds what it was given.
        pair.at_site.hold_reading = asyncio.Event()
        big = asyncio.ensure_future(pair.opener.send([message("x" * 6_000_000)], TIMEOUT_S))
        opener_pacing = pair.opener_socket.pacing
        async with asyncio.timeout(TIMEOUT_S):
            while not (opener_pacing.unsent_bytes() or 0) > 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        pair.at_site.hold_reading.set()
        assert await big == [Result(200)]
    assert Pacing().unsent_bytes() is None
