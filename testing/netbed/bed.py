"""A network test bed: hosts as network namespaces around one router namespace, edges behind a real NAT
gateway, and faults switched on and off in the router (mininet's hosts and cleanup, toxiproxy's faults).

::

    host i    eth0 198.18.i.2/24 ── h<i> 198.18.i.1 ┐
                                                    ├─ router (forwards; faults and the delay line live here)
    edge j    eth0 198.19.j.2/24 ── lan0 198.19.j.1 │
              gateway j  eth0 198.18.j.2/24 ── h<j> ┘

Addresses come from the benchmarking ranges of RFC 2544 (198.18.0.0/15), so they clash with nothing real.
The router knows the way to each edge's private network, so what keeps outsiders out is the gateway's
firewall, not a missing route. Nothing changes in the root namespace. The bed is a context manager: leaving
it stops every process started in its namespaces and deletes them, also when the block raised.
"""

from __future__ import annotations

import itertools
import re
from types import TracebackType
from typing import Self, TypeVar

import testing.netbed.faults as faults
from testing.netbed.availability import check_netbed
from testing.netbed.commands import iptables, sysctl
from testing.netbed.delay import Delay
from testing.netbed.errors import NetBedError
from testing.netbed.faults import Fault, Rules, Thin
from testing.netbed.hosts import Host, NatGateway
from testing.netbed.namespaces import Namespace, namespace_name, sweep_stale_namespaces

MAX_LINKS = 254
_ROLE = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
_beds = itertools.count(1)
F = TypeVar("F", bound=Fault)


class NetBed:
    """Hosts joined by a router, each in its own network namespace; see the module's docstring."""

    def __init__(self) -> None:
        self.number = next(_beds)
        self.router: Namespace | None = None
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[Namespace] = []
        self._faults: list[Fault] = []

    @property
    def namespaces(self) -> list[str]:
        """The names of every namespace this bed made (router, hosts, gateways)."""
        return [namespace.name for namespace in self._namespaces]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> Self:
        """Make the router (first removing what dead processes' beds left behind); raises
        :class:`~testing.netbed.errors.NetBedUnavailable` if this machine cannot make a bed."""
        if self.router is not None:
            return self
        check_netbed()
        sweep_stale_namespaces()
        self.router = self._namespace("router")
        try:
            sysctl(self.router.name, "net.ipv4.ip_forward", 1)
            # Packets coming back out of the delay line arrive on its TUN device with a source the router
            # reaches through another interface; the reverse-path filter would drop them.
            sysctl(self.router.name, "net.ipv4.conf.all.rp_filter", 0)
            sysctl(self.router.name, "net.ipv4.conf.default.rp_filter", 0)
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, role: str, *, behind_nat: bool = False) -> Host:
        """A new host called ``role`` (lower case letters, digits and dashes), linked to the router, or
        with ``behind_nat`` to a NAT gateway of its own that is linked to the router."""
        if not _ROLE.match(role) or role in self.hosts or role == "router":
            raise ValueError(f"host role {role!r}: need a new name of [a-z0-9-], at most 20 characters")
        router = self.start().router
        assert router is not None
        index = len(self.hosts) + 1
        if index > MAX_LINKS:
            raise NetBedError(f"a bed has at most {MAX_LINKS} hosts")
        port = f"h{index}"
        if behind_nat:
            gateway = self._gateway(role, index, port)
            host_ns = self._namespace(role)
            self._link(gateway.namespace, "lan0", f"198.19.{index}.1", host_ns, f"198.19.{index}.2")
            router.ip("route", "add", f"198.19.{index}.0/24", "via", f"198.18.{index}.2")
            host = Host(role, host_ns, f"198.19.{index}.2", port, gateway)
        else:
            host_ns = self._namespace(role)
            self._link(router, port, f"198.18.{index}.1", host_ns, f"198.18.{index}.2")
            host = Host(role, host_ns, f"198.18.{index}.2", port)
        self.hosts[role] = host
        return host

    def _gateway(self, role: str, index: int, port: str) -> NatGateway:
        assert self.router is not None
        namespace = self._namespace(f"{role}-gw")
        name = namespace.name
        self._link(self.router, port, f"198.18.{index}.1", namespace, f"198.18.{index}.2")
        sysctl(name, "net.ipv4.ip_forward", 1)
        iptables(name, "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE", table="nat")
        iptables(name, "-P", "FORWARD", "DROP")
        # INVALID first: a packet of a connection whose mapping was flushed must not pass as "from inside"
        # un-translated.
        iptables(name, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
        iptables(name, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        iptables(name, "-A", "FORWARD", "-i", "lan0", "-o", "eth0", "-j", "ACCEPT")
        # The gateway itself answers nothing from outside either (no resets for flushed mappings).
        iptables(name, "-A", "INPUT", "-i", "eth0", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                 "-j", "ACCEPT")  # fmt: skip
        iptables(name, "-A", "INPUT", "-i", "eth0", "-j", "DROP")
        # With loose tracking, conntrack would adopt a connection it sees in mid-life after a flush, as if
        # the mapping had never been lost; a real NAT that forgot a mapping breaks the connection.
        sysctl(name, "net.netfilter.nf_conntrack_tcp_loose", 0)
        return NatGateway(namespace, f"198.18.{index}.2", f"198.19.{index}.1")

    def _namespace(self, role: str) -> Namespace:
        namespace = Namespace.create(namespace_name(self.number, role))
        self._namespaces.append(namespace)
        return namespace

    def _link(self, near: Namespace, near_device: str, near_ip: str, far: Namespace, far_ip: str) -> None:
        """A veth pair from ``near``'s ``near_device`` to ``far``'s ``eth0``, ``far`` routing through it."""
        near.ip("link", "add", near_device, "type", "veth", "peer", "name", "eth0", "netns", far.name)
        near.ip("addr", "add", f"{near_ip}/24", "dev", near_device)
        near.ip("link", "set", near_device, "up")
        far.ip("addr", "add", f"{far_ip}/24", "dev", "eth0")
        far.ip("link", "set", "eth0", "up")
        far.ip("route", "add", "default", "via", near_ip)

    # Faults. Each is made off; switch it with on()/off() or hold it with `with`.

    def black_hole(self, host: Host) -> Rules:
        """Every packet to and from ``host`` dropped without an answer (a pulled cable)."""
        return self._keep(faults.black_hole(self._router_name(), host.router_port))

    def reset(self, host: Host) -> Rules:
        """Every TCP packet to and from ``host`` answered with a reset."""
        return self._keep(faults.reset(self._router_name(), host.router_port))

    def loss(self, host: Host, share: float) -> Rules:
        """``share`` of the packets to ``host``, and of those from it, dropped at random."""
        return self._keep(faults.loss(self._router_name(), host.router_port, share))

    def thin(self, host: Host, kbit: int) -> Thin:
        """``host``'s link shaped to ``kbit`` each way (its own interface and the router's toward it)."""
        return self._keep(faults.thin(self._router_name(), host.router_port, host.netns, host.device, kbit))

    def delay(self, ms: float) -> Delay:
        """Every packet crossing the router held ``ms`` milliseconds, in order (hosts added later are not
        delayed)."""
        assert self.router is not None, "start the bed first"
        return self._keep(Delay(self.router, [host.router_port for host in self.hosts.values()], ms))

    def _router_name(self) -> str:
        assert self.router is not None, "start the bed first"
        return self.router.name

    def _keep(self, fault: F) -> F:
        self._faults.append(fault)
        return fault

    def close(self) -> None:
        """Switch every fault off, stop every process started in the bed's namespaces, delete them."""
        errors: list[BaseException] = []
        for fault in reversed(self._faults):
            try:
                fault.off()
            except Exception as exc:
                # The namespaces go anyway, and with them whatever the fault left.
                errors.append(exc)
        self._faults.clear()
        for namespace in reversed(self._namespaces):
            try:
                namespace.close()
            except Exception as exc:
                errors.append(exc)
        self._namespaces.clear()
        self.router = None
        self.hosts.clear()
        if errors:
            raise NetBedError(f"cleaning up the bed: {errors[0]}") from errors[0]
