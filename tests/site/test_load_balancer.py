"""A site on two machines behind a load balancer: two msgbusd processes of one site on their own addresses
(as on two hosts), one real HAProxy in front of them, and the twin map pointing at HAProxy."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis

from testing.local_haproxy import HaproxyProcess
from testing.local_sites import LocalCluster, SiteProcess, free_port, wait_until
from tests.faults.harness import DAEMON_ARGS
from tests.support.services import RawService, all_answered
from wire import keys

pytestmark = pytest.mark.timeout(180)

CMD = "balanced.echo"


@pytest.fixture
def balanced() -> Iterator[tuple[LocalCluster, SiteProcess, HaproxyProcess]]:
    cluster = LocalCluster(size=2, extra_args=DAEMON_ARGS).prepare()
    first = cluster.sites[1]
    second = dataclasses.replace(first, port=free_port(), log_path=cluster.workdir / "msgbusd-2-b.log")
    proxy = HaproxyProcess([f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"]).start()
    first.advertised_address = proxy.address
    try:
        cluster.launch()
        second.start()
        yield cluster, second, proxy
    finally:
        second.stop()
        cluster.cleanup()
        proxy.cleanup()


def test_requests_reach_the_site_through_haproxy_while_either_machine_is_lost(
    balanced: tuple[LocalCluster, SiteProcess, HaproxyProcess],
) -> None:
    cluster, second, _proxy = balanced
    sender = redis.Redis.from_url(cluster.redis[0].url)
    receiver = redis.Redis.from_url(cluster.redis[1].url)
    wait_until(lambda: receiver.zcard(keys.INSTANCES) == 2, 30, "both processes of site 2")
    with RawService(cluster.redis[1].url, CMD):
        assert all_answered(sender, 2, CMD, 20)
        cluster.sites[1].kill()
        # The link through HAProxy broke with its process; the next one lands on the other.
        assert all_answered(sender, 2, CMD, 20)
        wait_until(lambda: receiver.zcard(keys.INSTANCES) == 1, 30, "the killed process taken over")
        cluster.sites[1].start()
        second.kill()
        assert all_answered(sender, 2, CMD, 20)
    sender.close()
    receiver.close()
