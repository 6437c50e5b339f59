"""The machines of a bed: a :class:`Host` (a namespace with one interface, ``eth0``, toward the router or
its NAT gateway) and a :class:`NatGateway` (a namespace between an edge host and the router that
masquerades and lets nothing in that the inside did not open)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from socket import AF_INET, SOCK_STREAM
from socket import socket as Socket
from typing import Any

from testing.netbed.commands import run_command
from testing.netbed.faults import Rules, freeze
from testing.netbed.namespaces import Namespace


@dataclass(eq=False)
class NatGateway:
    """The NAT gateway in front of one edge host."""

    namespace: Namespace
    # Its address on the router's link, which the edge's connections come from.
    public_address: str
    # Its address on the edge's link, the edge's default route.
    private_address: str

    @property
    def netns(self) -> str:
        return self.namespace.name

    def flush(self) -> None:
        """Forget every mapping (``conntrack -F``), as a gateway that rebooted or timed them out: the
        connections through it stop carrying data, new ones from inside work at once."""
        run_command(self.namespace.wrap(["conntrack", "-F"]))

    def freeze(self) -> Rules:
        """A fault: the gateway forwards nothing, either way, and answers nothing."""
        return freeze(self.netns)


@dataclass(eq=False)
class Host:
    """A machine of the bed: its own network namespace, reached by others at ``address``."""

    role: str
    namespace: Namespace
    # Its IP address as other hosts reach it; for an edge behind NAT, its private address, which only its
    # gateway routes to.
    address: str
    # The router's interface that carries its traffic (for an edge, the one toward its gateway).
    router_port: str
    gateway: NatGateway | None = None
    # Its own interface.
    device: str = "eth0"

    @property
    def netns(self) -> str:
        return self.namespace.name

    @property
    def behind_nat(self) -> bool:
        return self.gateway is not None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside this host: ``["ip", "netns", "exec", netns, *argv]``."""
        return self.namespace.wrap(argv)

    def popen(self, argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in this host (``options`` go to ``subprocess.Popen``); it is stopped when the bed
        closes."""
        return self.namespace.popen(argv, **options)

    def run(self, argv: Sequence[str], **options: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in this host to its end (output captured as text, failure raises, unless
        ``options`` say otherwise)."""
        return self.namespace.run(argv, **options)

    def socket(self, family: int = AF_INET, kind: int = SOCK_STREAM) -> Socket:
        """A socket of this host, usable from the test's own process and threads."""
        return self.namespace.socket(family, kind)

    def connect(self, address: str, port: int, timeout_s: float) -> Socket:
        """A TCP connection from this host to ``address:port``; raises ``TimeoutError`` or another
        ``OSError`` (e.g. ``ConnectionRefusedError``) as ``socket.create_connection`` does."""
        sock = self.socket()
        try:
            sock.settimeout(timeout_s)
            sock.connect((address, port))
        except BaseException:
            sock.close()
            raise
        return sock
