"""``msgbusd --processes N``: a group of a site's processes under one parent that keeps N running."""

from __future__ import annotations

import os
import re
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from msgbusd.site.instance import pick
from msgbusd.site.supervisor import child_arguments, for_slot
from testing.local_sites import LocalCluster, free_port, wait_until
from tests.faults.harness import DAEMON_ARGS
from tests.support.services import RawService, all_answered, pop_replies, push_request
from wire import keys

pytestmark = pytest.mark.timeout(180)

CMD = "group.echo"


def children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


@pytest.fixture
def group_of_three() -> Iterator[tuple[LocalCluster, int]]:
    """A site of ``--processes 3`` (and the other site), with the first of its three metrics ports."""
    cluster = LocalCluster(size=2, extra_args=DAEMON_ARGS).prepare()
    metrics_port = free_port(3)
    cluster.sites[0].extra_args = [
        *DAEMON_ARGS,
        "--processes",
        "3",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    ]
    try:
        cluster.launch()
        yield cluster, metrics_port
    finally:
        cluster.cleanup()


def instances_reporting(first_port: int, count: int) -> list[str | None]:
    """The instance each of ``count`` metrics ports reports for (None: it does not answer)."""
    found: list[str | None] = []
    for port in range(first_port, first_port + count):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                labels = set(re.findall(r'instance="([^"]+)"', response.read().decode()))
        except OSError:
            labels = set()
        found.append(labels.pop() if len(labels) == 1 else None)
    return found


def test_a_process_of_the_group_killed_is_started_again_while_requests_flow(
    group_of_three: tuple[LocalCluster, int],
) -> None:
    cluster, metrics_port = group_of_three
    parent = cluster.sites[0].process
    assert parent is not None
    sender = redis.Redis.from_url(cluster.redis[0].url)
    wait_until(lambda: len(children(parent.pid)) == 3, 30, "three processes")
    wait_until(lambda: sender.zcard(keys.INSTANCES) == 3, 30, "three live instances")
    with RawService(cluster.redis[1].url, CMD):
        assert all_answered(sender, 2, CMD, 20)
        first = children(parent.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        # Requests pushed right after the kill are answered too (its items and leases are taken over).
        assert all_answered(sender, 2, CMD, 20)
        wait_until(lambda: len(children(parent.pid) - {victim}) == 3, 30, "a new third process")
        victim_id = f"{socket.gethostname()}:{victim}"
        wait_until(
            lambda: sender.zscore(keys.INSTANCES, victim_id) is None and sender.zcard(keys.INSTANCES) == 3,
            30,
            "the killed process taken over, and its successor live",
        )
        assert all_answered(sender, 2, CMD, 20)
    assert "ended (signal 9); starting another" in cluster.sites[0].log()
    # Each process reports on a port of its own, and the new one on the port of the one it replaced.
    host = socket.gethostname()
    wait_until(
        lambda: (
            sorted(filter(None, instances_reporting(metrics_port, 3)))
            == sorted(f"{host}:{pid}" for pid in children(parent.pid))
        ),
        30,
        "each process's metrics on its own port",
    )
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 0
    assert sender.zcard(keys.INSTANCES) == 0, "each process left the site as it stopped"
    sender.close()


def test_the_processes_get_the_command_line_without_processes_and_with_reuse_port() -> None:
    assert child_arguments(["--twin", "1", "--processes", "3", "--listen", "[::]:1"]) == [
        "--twin",
        "1",
        "--listen",
        "[::]:1",
        "--reuse-port",
    ]
    assert child_arguments(["--processes=2", "--reuse-port"]) == ["--reuse-port"]
    assert for_slot(["--metrics-listen", "[::1]:9100", "--twin", "1"], 2) == [
        "--metrics-listen",
        "[::1]:9102",
        "--twin",
        "1",
    ]
    assert for_slot(["--metrics-listen=127.0.0.1:9100"], 1) == ["--metrics-listen=127.0.0.1:9101"]


def names_sharing_the_work() -> tuple[str, str]:
    """Two instance names between which twins 2 and 3 go to different processes."""
    for number in range(100):
        names = [f"a{number}", f"b{number}"]
        if pick("2", names) != pick("3", names):
            return names[0], names[1]
    raise AssertionError("no such names")


def test_each_destination_gets_its_requests_in_push_order_from_a_site_of_two_processes() -> None:
    cluster = LocalCluster(size=3, processes=2, extra_args=DAEMON_ARGS).prepare()
    # Named so that twins 2 and 3 are sent to by different processes of site 1, one of which also takes the
    # local requests and tells the other of the ones for its twin.
    first, second = names_sharing_the_work()
    cluster.sites[0].extra_args = [*cluster.sites[0].extra_args, "--instance", first]
    (sibling,) = cluster.siblings[1]
    sibling.extra_args = [*sibling.extra_args, "--instance", second]
    try:
        cluster.launch()
        sender = redis.Redis.from_url(cluster.redis[0].url)
        wait_until(lambda: sender.zcard(keys.INSTANCES) == 2, 30, "both processes of site 1")
        services = {twin: RawService(cluster.redis[twin - 1].url, CMD) for twin in (2, 3)}
        for service in services.values():
            service.start()
        try:
            rets = [
                push_request(sender, [2 + n % 2], CMD, str(n).encode(), exp=60, retries=5, rpush=True)
                for n in range(400)
            ]
            for ret in rets:
                assert pop_replies(sender, ret, 1, timeout_s=60)[0].err == ""
        finally:
            for service in services.values():
                service.__exit__(None, None, None)
        holders = {name: sender.hget(keys.OWNERS, name) for name in ("2", "3")}
        sender.close()
    finally:
        cluster.cleanup()
    assert holders == {"2": pick("2", [first, second]).encode(), "3": pick("3", [first, second]).encode()}
    for service in services.values():
        received = [int(request.payload) for request in service.requests]
        assert received == sorted(received) and len(received) == 200
