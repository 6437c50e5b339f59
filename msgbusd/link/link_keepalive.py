"""How a link finds out that its connection is dead: the kernel's TCP keepalive, not pings the sites answer.

A link that carries nothing is checked by the kernel at each end: after ``idle_s`` of silence it sends a
probe, then one every ``interval_s``, and once nothing came back for ``dead_after_s`` (``TCP_USER_TIMEOUT``,
which also bounds how long something written may wait for its acknowledgement) the connection is closed
and the link with it. The other kernel answers the probes whatever its site is doing: a site busy for a
few seconds (a herd of edges coming back) is never taken for a dead one, and checking ten thousand idle
links costs the site's process nothing.

The opener of a link checks it after ``--link-ping`` seconds of silence (:func:`opener_keepalive`: the edge
of an uplink learns a few seconds later that its NAT gateway forgot the connection, and dials again). The
site's end checks less often (:data:`SITE_KEEPALIVE`): it needs no haste (its opener dials again when the
connection died, and the new uplink replaces the old one at once), and its probes would be one more packet
each way for each of thousands of links.
"""

from __future__ import annotations

import asyncio
import math
import socket
from dataclasses import dataclass

# Probes sent before the connection is given up (TCP_USER_TIMEOUT decides the end; this only keeps Linux
# from ending it sooner).
PROBES = 3


@dataclass(frozen=True)
class Keepalive:
    """The kernel's checks of one connection: the first probe after ``idle_s`` of silence, the next ones
    every ``interval_s``, and the connection closed once nothing came for ``dead_after_s``."""

    idle_s: int
    interval_s: int
    dead_after_s: float

    def apply(self, sock: socket.socket) -> bool:
        """Set the checks on ``sock`` (a TCP socket); False where this system cannot (the link then finds a
        dead connection only when something it sends is not answered)."""
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, self.idle_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, self.interval_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, PROBES)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(self.dead_after_s * 1000))
        except (OSError, AttributeError):
            return False
        return True

    def apply_to(self, transport: asyncio.BaseTransport | None) -> bool:
        """:meth:`apply` to the socket of ``transport``, if it has a TCP one."""
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return False
        return self.apply(sock)


def opener_keepalive(ping_s: float) -> Keepalive:
    """The checks of a link this site opened: probed after ``ping_s`` of silence, a probe a second after
    that (a fifth of ``ping_s`` for longer ones), and closed once :data:`PROBES` went unanswered (one lost
    probe does not close a link). The kernel counts whole seconds."""
    idle_s = max(1, math.ceil(ping_s))
    interval_s = max(1, math.ceil(ping_s / 5))
    return Keepalive(idle_s, interval_s, float(idle_s + PROBES * interval_s))


# The checks of a link opened to this site.
SITE_KEEPALIVE = Keepalive(idle_s=60, interval_s=10, dead_after_s=90.0)
