"""Peer URLs from twin addresses (bare IPv4/IPv6, with or without a port, host names, full URLs)."""

from __future__ import annotations

import pytest

from twin_resolver.address import peer_url


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("1.2.3.4", "http://1.2.3.4:8051/zbus-remote"),
        ("300:1::2", "http://[300:1::2]:8051/zbus-remote"),
        (
            "301:5a3e:1234:5678:9abc:def0:1234:5678",
            "http://[301:5a3e:1234:5678:9abc:def0:1234:5678]:8051/zbus-remote",
        ),
        ("::1", "http://[::1]:8051/zbus-remote"),
        ("1.2.3.4:9000", "http://1.2.3.4:9000/zbus-remote"),
        ("[300:1::2]:9000", "http://[300:1::2]:9000/zbus-remote"),
        ("[300:1::2]", "http://[300:1::2]:8051/zbus-remote"),
        ("example.org", "http://example.org:8051/zbus-remote"),
        ("example.org:9000", "http://example.org:9000/zbus-remote"),
        ("localhost:18051", "http://localhost:18051/zbus-remote"),
        ("http://gw.example.org:8080", "http://gw.example.org:8080/zbus-remote"),
        ("https://gw.example.org/rmb/", "https://gw.example.org/rmb/zbus-remote"),
        (" 300:1::2\n", "http://[300:1::2]:8051/zbus-remote"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]:8051/zbus-remote"),
    ],
)
def test_peer_url(address: str, url: str) -> None:
    assert peer_url(address, "/zbus-remote") == url


def test_path_with_or_without_slash_and_default_port() -> None:
    assert peer_url("300:1::2", "zbus-reply") == "http://[300:1::2]:8051/zbus-reply"
    assert peer_url("300:1::2", "/zbus-reply", default_port=18051) == "http://[300:1::2]:18051/zbus-reply"
    assert peer_url("1.2.3.4:9000", "/zbus-reply", default_port=18051) == "http://1.2.3.4:9000/zbus-reply"


@pytest.mark.parametrize("address", ["", "  "])
def test_empty_address(address: str) -> None:
    with pytest.raises(ValueError, match=r"^twin has no address$"):
        peer_url(address, "/zbus-remote")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("[300:1::2", "invalid twin address '\\[300:1::2'"),
        ("[300:1::2]x", "invalid twin address"),
        ("[zz]:80", "invalid IPv6 address in twin address"),
        ("[1.2.3.4]:80", "invalid IPv6 address in twin address"),
        ("300:1::2::3", "invalid twin address"),
        (":9000", "invalid twin address"),
        ("1.2.3.4:", "invalid port in twin address"),
        ("1.2.3.4:http", "invalid port in twin address"),
        ("1.2.3.4:0", "invalid port in twin address"),
        ("1.2.3.4:65536", "invalid port in twin address"),
        ("[300:1::2]:-1", "invalid port in twin address"),
    ],
)
def test_invalid_address(address: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        peer_url(address, "/zbus-remote")
