"""Turning a twin's address (usually a bare IPv6) into the URL of its daemon's HTTP endpoints."""

from __future__ import annotations

import ipaddress

DEFAULT_PORT = 8051


def peer_url(address: str, path: str, default_port: int = DEFAULT_PORT) -> str:
    """The URL of ``path`` (e.g. ``/zbus-remote``) on the daemon at ``address``.

    ``address`` is a bare IP (``1.2.3.4``, ``300:1::2``), an IP or host name with a port (``1.2.3.4:9000``,
    ``[300:1::2]:9000``, ``example.org:9000``), a bracketed IPv6 or a host name without one (port
    ``default_port``), or a full ``http(s)://`` base URL used as it is.
    """
    address = address.strip()
    if not address:
        raise ValueError("twin has no address")
    path = "/" + path.lstrip("/")
    if address.startswith(("http://", "https://")):
        return address.rstrip("/") + path
    return f"http://{_host_port(address, default_port)}{path}"


def _host_port(address: str, default_port: int) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        pass
    else:
        return f"{_host(ip)}:{default_port}"
    if address.startswith("["):
        inside, bracket, rest = address[1:].partition("]")
        try:
            ip = ipaddress.IPv6Address(inside)
        except ValueError:
            raise ValueError(f"invalid IPv6 address in twin address {address!r}") from None
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"invalid twin address {address!r}")
        return f"{_host(ip)}:{_port(rest[1:], address) if rest else default_port}"
    host, colon, port = address.rpartition(":")
    if not colon:
        return f"{address}:{default_port}"
    if not host or ":" in host:
        raise ValueError(f"invalid twin address {address!r}")
    return f"{host}:{_port(port, address)}"


def _host(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if ip.version == 4:
        return str(ip)
    # A zone id (fe80::1%eth0) is written %25eth0 inside a URL (RFC 6874).
    return "[" + str(ip).replace("%", "%25") + "]"


def _port(text: str, address: str) -> int:
    if text.isascii() and text.isdigit() and 0 < int(text) < 65536:
        return int(text)
    raise ValueError(f"invalid port in twin address {address!r}")
