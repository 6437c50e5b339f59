"""A link's connection is checked by the kernel: the opener's after ``--link-ping`` of silence and found dead
once three probes went unanswered (so that one lost probe does not close it); the settings are those the
socket gets."""

from __future__ import annotations

import socket

import pytest

from msgbusd.link.link_keepalive import PROBES, SITE_KEEPALIVE, Keepalive, opener_keepalive


@pytest.mark.parametrize(
    ("ping_s", "idle_s", "interval_s", "dead_after_s"),
    [(1.0, 1, 1, 4.0), (5.0, 5, 1, 8.0), (0.3, 1, 1, 4.0), (30.0, 30, 6, 48.0)],
)
def test_the_openers_checks_follow_the_ping_interval(
    ping_s: float, idle_s: int, interval_s: int, dead_after_s: float
) -> None:
    keepalive = opener_keepalive(ping_s)
    assert keepalive == Keepalive(idle_s, interval_s, dead_after_s)
    # Never given up before every probe had its chance.
    assert keepalive.dead_after_s == keepalive.idle_s + PROBES * keepalive.interval_s


def test_the_site_end_checks_seldom() -> None:
    assert SITE_KEEPALIVE.idle_s >= 60 and SITE_KEEPALIVE.dead_after_s >= 60


def test_the_checks_are_set_on_the_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert opener_keepalive(5.0).apply(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == PROBES
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 8_000


def test_a_socket_that_is_not_tcp_is_left_as_it_is() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert opener_keepalive(5.0).apply(left) is False
