"""A network test bed for tests and benchmarks: hosts as network namespaces joined by a router, edges behind
a real NAT gateway, and faults (a pulled cable, resets, loss, a thin link, delay, a gateway that forgets or
freezes) switched on and off around the step under test. Needs root, iproute2, iptables, conntrack and
/dev/net/tun; :func:`require_netbed` says why not when they are missing.

::

    with NetBed() as bed, BedSites() as sites:
        cloud = bed.add_host("cloud")
        edge = bed.add_host("edge", behind_nat=True)
        sites.add(cloud)
        sites.add(edge, extra_args=["--uplink", "1"])
        sites.start()
        with bed.delay(50), bed.loss(edge, 0.05):
            ...
"""

from testing.netbed.availability import check_netbed, require_netbed
from testing.netbed.bed import NetBed
from testing.netbed.delay import Delay
from testing.netbed.errors import NetBedError, NetBedUnavailable
from testing.netbed.faults import Fault, Rules, Thin
from testing.netbed.hosts import Host, NatGateway
from testing.netbed.namespaces import Namespace, sweep_stale_namespaces
from testing.netbed.sites import BedSite, BedSites

__all__ = [
    "BedSite",
    "BedSites",
    "Delay",
    "Fault",
    "Host",
    "Namespace",
    "NatGateway",
    "NetBed",
    "NetBedError",
    "NetBedUnavailable",
    "Rules",
    "Thin",
    "check_netbed",
    "require_netbed",
    "sweep_stale_namespaces",
]
