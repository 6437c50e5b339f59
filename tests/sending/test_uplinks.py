"""Uplinks between real sites: a site that cannot be dialed (no address in the twin map) keeps a link open to
a cloud site (``--uplink``), and the cloud reaches it over that link only, holding what waits for it while
the link is down, without spending its tries."""

from __future__ import annotations

import time

import pytest
import redis

from client.status import read_daemon
from msgbusd.site.instance import pick
from testing.local_sites import LocalCluster, SiteProcess, wait_until
from tests.support.answers import Answers
from tests.support.metrics import scrape
from tests.support.services import RawService
from wire import keys

pytestmark = [pytest.mark.processes, pytest.mark.timeout(150)]

CLOUD, EDGE = 1, 2
EACH_WAY = 200


def links_open(site: SiteProcess) -> float:
    return scrape(site.url).get("msgbus_links_open", 0.0)


def test_a_site_without_an_address_is_reached_over_its_uplink_and_after_the_cloud_crashes() -> None:
    cluster = LocalCluster(size=2, extra_args=["--link-after", "1"]).prepare()
    cloud, edge = cluster.sites
    edge.advertised_address = ""
    edge.extra_args = [*edge.extra_args, "--uplink", str(CLOUD)]
    cluster.launch()
    to_edge, to_cloud = Answers(cluster.redis[0].url), Answers(cluster.redis[1].url)
    try:
        with (
            RawService(cluster.redis[0].url, "cloud.echo", handler=lambda data: b"cloud:" + data) as at_cloud,
            RawService(cluster.redis[1].url, "edge.echo", handler=lambda data: b"edge:" + data) as at_edge,
        ):
            wait_until(lambda: links_open(cloud) == 1, 20, "the edge's uplink")
            for n in range(EACH_WAY // 2):
                to_edge.push(EDGE, "edge.echo", b"a%d" % n)
                to_cloud.push(CLOUD, "cloud.echo", b"a%d" % n)
            wait_until(lambda: to_edge.done() and to_cloud.done(), 60, "the first half answered")
            # msgbus status shows the uplink at either end.
            (at_cloud_end,) = read_daemon(cloud.url).uplinks
            (at_edge_end,) = read_daemon(edge.url).uplinks
            assert (at_cloud_end.twin, at_cloud_end.direction, at_cloud_end.open) == (EDGE, "in", True)
            assert (at_edge_end.twin, at_edge_end.direction, at_edge_end.open) == (CLOUD, "out", True)

            # The cloud crashes; what is pushed meanwhile waits in either site's Redis. The requests to the
            # edge have one try: none is spent while its uplink is not open again.
            cloud.kill()
            wait_until(
                lambda: not read_daemon(edge.url).uplinks[0].open, 20, "the edge to see its uplink closed"
            )
            for n in range(EACH_WAY // 2, EACH_WAY):
                to_edge.push(EDGE, "edge.echo", b"b%d" % n, retries=1)
                to_cloud.push(CLOUD, "cloud.echo", b"b%d" % n)
            cloud.start()
            restarted_at = time.monotonic()
            wait_until(lambda: to_edge.done() and to_cloud.done(), 90, "every request answered")
            time.sleep(1.0)  # a second reply would come soon after the first
            to_edge.collect()
            to_cloud.collect()
        extra = (to_edge.extra(), to_cloud.extra())
        log = cloud.log()
    finally:
        cluster.cleanup()

    for answers, prefix in ((to_edge, b"edge:"), (to_cloud, b"cloud:")):
        assert answers.first_replies() == answers.echoed(prefix)
    assert extra == (0, 0)
    # Executed once each, nothing lost.
    assert sorted(at_edge.payloads.values()) == [1] * EACH_WAY
    assert sorted(at_cloud.payloads.values()) == [1] * EACH_WAY
    # The cloud reached the edge over its uplink only (it has no address to dial) and, once started again,
    # within seconds.
    assert "opened its uplink" in log
    assert "unusable address" not in log
    first_after = min(at for ret, at in to_edge.answered_at.items() if to_edge.rets[ret].startswith(b"b"))
    print(f"the edge answered again {first_after - restarted_at:.1f}s after the cloud was started again")
    assert first_after - restarted_at <= 10.0


def test_the_cloud_process_an_uplink_lands_on_sends_to_that_twin() -> None:
    # Two processes at the cloud; the lease of sending to the edge would go to WINNER by rendezvous hashing,
    # but the edge's uplink is open to the other one, started first: that one must send to the edge.
    cluster = LocalCluster(size=2, processes=2, extra_args=["--link-after", "1"]).prepare()
    cloud, edge = cluster.sites
    (sibling,) = cluster.siblings[CLOUD]
    cluster.siblings[EDGE] = []
    cloud.extra_args = [*cloud.extra_args, "--instance", "cloud-a"]
    sibling.extra_args = [*sibling.extra_args, "--instance", "cloud-b"]
    winner = pick(str(EDGE), ["cloud-a", "cloud-b"])
    (first, first_name), second = (
        ((sibling, "cloud-b"), cloud) if winner == "cloud-a" else ((cloud, "cloud-a"), sibling)
    )
    edge.advertised_address = ""
    edge.extra_args = [*edge.extra_args, "--uplink", str(CLOUD)]
    to_edge, to_cloud = Answers(cluster.redis[0].url), Answers(cluster.redis[1].url)
    try:
        cluster.write_twins()
        first.start()
        edge.start()
        wait_until(lambda: "opened its uplink" in first.log(), 20, "the edge's uplink")
        second.start()
        with redis.Redis.from_url(cluster.redis[0].url) as conn:
            wait_until(lambda: conn.zcard(keys.INSTANCES) == 2, 20, "both cloud processes live")
        with (
            RawService(cluster.redis[0].url, "cloud.echo", handler=lambda data: b"cloud:" + data),
            RawService(cluster.redis[1].url, "edge.echo", handler=lambda data: b"edge:" + data) as at_edge,
        ):
            for n in range(100):
                to_edge.push(EDGE, "edge.echo", b"%d" % n, retries=1)
                to_cloud.push(CLOUD, "cloud.echo", b"%d" % n)
            wait_until(lambda: to_edge.done() and to_cloud.done(), 60, "every request answered")
        with redis.Redis.from_url(cluster.redis[0].url, decode_responses=True) as conn:
            sender = conn.hget(keys.OWNERS, str(EDGE))
    finally:
        cluster.cleanup()
    assert all(replies[0].err == "" for replies in to_edge.replies.values())
    assert sorted(at_edge.payloads.values()) == [1] * 100
    assert sender == first_name != winner
