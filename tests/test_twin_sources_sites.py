"""Two real sites that look their twins up in an HTTP twin source, and ride out its outage."""

from __future__ import annotations

import time

import pytest
import redis

from testing.local_sites import LocalCluster
from tests.support.metrics import scrape
from tests.support.services import RawService, pop_replies, push_request
from tests.support.twin_source import TwinSource


def twin_cache_counts(cluster: LocalCluster) -> dict[str, float]:
    prefix = 'msgbus_twin_cache_total{what="'
    return {
        name[len(prefix) :].split('"')[0]: value
        for name, value in scrape(cluster.sites[0].url).items()
        if name.startswith(prefix)
    }


@pytest.mark.slow
def test_sites_resolve_twins_over_http_and_serve_the_last_answer_while_it_is_down() -> None:
    cluster = LocalCluster(size=2, extra_args=["--twin-cache-ttl", "0.3", "--twin-lookup-timeout", "1"])
    cluster.prepare()
    source = TwinSource(cluster.twins_file).start()
    cluster.twin_source = source.url
    for site in cluster.sites:
        site.twin_source = source.url
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.twins"):
            (reply,) = pop_replies(site1, push_request(site1, [2], "echo.twins", b"first"), 1)
            assert (reply.err, reply.payload) == ("", b"first")
            assert source.requests >= 2, "site 1 looked up twin 2, site 2 looked up twin 1"

            source.stop()
            time.sleep(0.5)  # past the 0.3 s TTL: the next look-ups go to the (now absent) source
            (reply,) = pop_replies(site1, push_request(site1, [2], "echo.twins", b"during"), 1)
            assert (reply.err, reply.payload) == ("", b"during"), "the last known answer is served"
            counts = twin_cache_counts(cluster)
            assert counts["stale_served"] >= 1 and counts["failures"] >= 1

            (error,) = pop_replies(site1, push_request(site1, [42], "echo.twins"), 1)
            assert error.err.startswith("all retries done: "), error.err
    finally:
        source.stop()
        site1.close()
        cluster.cleanup()
