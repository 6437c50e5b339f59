"""The network test bed for real: namespaces, veths, iptables, tbf, conntrack and the delay line, checked
by what TCP between its hosts does, and two msgbusd sites talking across it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from client import Client, Service
from testing.local_sites import wait_until
from testing.netbed import BedSites, Host, NetBed, NetBedUnavailable, sweep_stale_namespaces
from testing.netbed import availability as availability_module
from testing.netbed.namespaces import list_namespaces
from tests.netbed.echo import ECHO_PORT, connect_s, echoes, round_trip_s, start_echo_server

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(60)]

# Long enough for a connection across the bed (well under a millisecond without faults), short enough
# that the checks that a connection does not get through stay quick.
BLOCKED_S = 1.0


@dataclass
class Hosts:
    bed: NetBed
    a: Host
    b: Host
    edge: Host


@pytest.fixture(scope="module")
def hosts(module_bed: NetBed) -> Iterator[Hosts]:
    """Hosts a and b, and an edge behind NAT, each running an echo server."""
    found = Hosts(
        module_bed,
        module_bed.add_host("a"),
        module_bed.add_host("b"),
        module_bed.add_host("edge", behind_nat=True),
    )
    for host in (found.a, found.b, found.edge):
        start_echo_server(host)
    yield found


def reaches(client: Host, server: Host) -> bool:
    """A new connection from ``client`` to ``server``'s echo server carries data both ways."""
    with client.connect(server.address, ECHO_PORT, BLOCKED_S) as conn:
        return echoes(conn, b"ping")


def rules_and_queues(*namespaces: str) -> dict[str, str]:
    """Everything a fault may change in ``namespaces``, as the commands show it."""
    shown = {}
    for netns in namespaces:
        for command in (["iptables-save"], ["tc", "qdisc", "show"], ["ip", "rule"], ["ip", "route"]):
            done = subprocess.run(
                ["ip", "netns", "exec", netns, *command], capture_output=True, text=True, check=True
            )
            lines = [line for line in done.stdout.splitlines() if not line.startswith(("#", ":"))]
            shown[f"{netns} {' '.join(command)}"] = "\n".join(lines)
    return shown


def test_two_hosts_reach_each_other_over_tcp(hosts: Hosts) -> None:
    assert reaches(hosts.a, hosts.b)
    assert reaches(hosts.b, hosts.a)
    assert hosts.a.address != hosts.b.address
    assert hosts.a.address.startswith("198.18.") and hosts.b.address.startswith("198.18.")


def test_black_hole_drops_without_a_reset_until_switched_off(hosts: Hosts) -> None:
    with hosts.bed.black_hole(hosts.b):
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            hosts.a.connect(hosts.b.address, ECHO_PORT, BLOCKED_S)
        assert time.monotonic() - started >= BLOCKED_S * 0.9
    assert reaches(hosts.a, hosts.b)


def test_reset_refuses_connections_at_once(hosts: Hosts) -> None:
    with hosts.bed.reset(hosts.b):
        started = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            hosts.a.connect(hosts.b.address, ECHO_PORT, 5.0)
        assert time.monotonic() - started < 0.5
    assert reaches(hosts.a, hosts.b)


def test_delay_holds_each_way_through_the_router(hosts: Hosts) -> None:
    with hosts.bed.delay(100):
        # SYN and SYN-ACK each cross the router once.
        assert 0.2 <= connect_s(hosts.a, hosts.b) < 0.4
        assert 0.2 <= connect_s(hosts.edge, hosts.b) < 0.4
        assert reaches(hosts.a, hosts.b)
    assert connect_s(hosts.a, hosts.b) < 0.05


def test_thin_link_takes_its_time(hosts: Hosts) -> None:
    size = 250_000
    with hosts.bed.thin(hosts.b, 1000):
        # 2 Mbit each way at 1 Mbit/s: about 2 s, the echo's way back overlapping the way there.
        assert 1.5 <= round_trip_s(hosts.a, hosts.b, size) < 8.0
    assert round_trip_s(hosts.a, hosts.b, size) < 1.0


def test_total_loss_passes_nothing_until_switched_off(hosts: Hosts) -> None:
    with hosts.bed.loss(hosts.b, 1.0), pytest.raises(TimeoutError):
        hosts.a.connect(hosts.b.address, ECHO_PORT, BLOCKED_S)
    assert reaches(hosts.a, hosts.b)


def test_faults_switch_idempotently_and_off_restores_what_was_there(hosts: Hosts) -> None:
    bed, b, gateway = hosts.bed, hosts.b, hosts.edge.gateway
    assert gateway is not None and bed.router is not None
    namespaces = (bed.router.name, b.netns, gateway.netns)
    before = rules_and_queues(*namespaces)
    for fault in (
        bed.black_hole(b), bed.reset(b), bed.loss(b, 0.3), bed.thin(b, 2000), bed.delay(10),
        gateway.freeze(),
    ):  # fmt: skip
        fault.on()
        fault.on()
        changed = rules_and_queues(*namespaces)
        assert changed != before, fault
        fault.off()
        fault.off()
        assert rules_and_queues(*namespaces) == before, fault
    with bed.black_hole(b), bed.black_hole(b):
        pass
    assert rules_and_queues(*namespaces) == before


def test_the_edge_connects_out_through_its_nat_and_nobody_connects_in(hosts: Hosts) -> None:
    assert reaches(hosts.edge, hosts.b)
    with pytest.raises(TimeoutError):
        hosts.b.connect(hosts.edge.address, ECHO_PORT, BLOCKED_S)
    assert hosts.edge.gateway is not None
    with pytest.raises(TimeoutError):
        hosts.b.connect(hosts.edge.gateway.public_address, ECHO_PORT, BLOCKED_S)


def test_a_flushed_gateway_breaks_connections_in_their_middle_but_not_new_ones(hosts: Hosts) -> None:
    gateway = hosts.edge.gateway
    assert gateway is not None
    with hosts.edge.connect(hosts.b.address, ECHO_PORT, BLOCKED_S) as old:
        assert echoes(old, b"before")
        gateway.flush()
        with pytest.raises(TimeoutError):
            echoes(old, b"after", timeout_s=BLOCKED_S)
        assert reaches(hosts.edge, hosts.b)


def test_a_frozen_gateway_lets_nothing_out_until_switched_off(hosts: Hosts) -> None:
    assert hosts.edge.gateway is not None
    with hosts.edge.gateway.freeze(), pytest.raises(TimeoutError):
        hosts.edge.connect(hosts.b.address, ECHO_PORT, BLOCKED_S)
    assert reaches(hosts.edge, hosts.b)


def test_msgbusd_sites_on_the_hosts_answer_requests_also_behind_nat(hosts: Hosts) -> None:
    with BedSites() as sites:
        caller = sites.add(hosts.a)
        callee = sites.add(hosts.b)
        # Nobody can dial the edge: it keeps a link open to the caller's site, which sends it everything.
        edge = sites.add(hosts.edge, extra_args=["--uplink", str(caller.twin)])
        sites.start()
        services = []
        for site in (callee, edge):
            service = Service(site.redis_url, poll_interval=0.2)
            service.register("netbed.upper", lambda request: request.data.upper())
            thread = threading.Thread(target=service.run, daemon=True)
            thread.start()
            services.append((service, thread))
        try:
            with Client(caller.redis_url) as client:
                across = client.call_one(callee.twin, "netbed.upper", b"across the bed", timeout=20)
                inward = client.call_one(edge.twin, "netbed.upper", b"behind the nat", timeout=20)
        finally:
            for service, thread in services:
                service.stop()
                thread.join(timeout=5)
    assert across == b"ACROSS THE BED"
    assert inward == b"BEHIND THE NAT"


def test_leaving_the_bed_removes_its_namespaces_and_processes(needs_netbed: None) -> None:
    with NetBed() as bed:
        host = bed.add_host("a")
        bed.add_host("edge", behind_nat=True)
        server = start_echo_server(host)
        made = bed.namespaces
        assert set(made) <= set(list_namespaces())
    assert not set(made) & set(list_namespaces())
    assert server.poll() is not None


def test_a_bed_is_removed_also_when_its_block_raised(needs_netbed: None) -> None:
    with pytest.raises(RuntimeError, match="the test failed"), NetBed() as bed:
        bed.add_host("a")
        made = bed.namespaces
        raise RuntimeError("the test failed")
    assert not set(made) & set(list_namespaces())


def test_the_sweep_removes_namespaces_of_dead_processes_only(needs_netbed: None) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    stale, live = f"mbn-{finished.pid}-1-stale", f"mbn-{os.getpid()}-999999-live"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    left_running = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "60"])
    try:
        wait_until(lambda: left_running.pid in _pids_in(stale), 5, "the leftover process")
        removed = sweep_stale_namespaces()
        assert stale in removed and live not in removed
        assert stale not in list_namespaces() and live in list_namespaces()
        assert left_running.wait(timeout=5) < 0, "killed by the sweep"
    finally:
        left_running.kill()
        left_running.wait()
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _pids_in(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(pid) for pid in done.stdout.split()]


def test_without_root_the_bed_says_why_it_cannot_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(availability_module.os, "geteuid", lambda: 1000)
    reason = availability_module.require_netbed()
    assert reason is not None and "root" in reason
    with pytest.raises(NetBedUnavailable, match="root"):
        NetBed().start()
