"""Real sites on a Redis that may evict keys, and on one that fills up: the daemon's start warning, what
``msgbus status`` says, and a full Redis that refuses new requests while nothing it took is lost."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from typer.testing import CliRunner

from client import Client, SiteRedisFull
from client.cli import app
from client.cli_common import EXIT_REDIS
from client.status import gather
from client.status_check import DEGRADED, assess
from testing.local_sites import LocalCluster, wait_until
from tests.support.metrics import scrape
from tests.support.services import RawService
from wire.redis_memory import evicting_policy_warning

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(180)]

runner = CliRunner()
# A payload that fills Redis in a few hundred requests.
PAYLOAD_BYTES = 2048
# Room left in Redis above what the started site uses.
ROOM_BYTES = 512 * 1024


def daemon_warnings(site_url: str) -> list[str]:
    with httpx.Client(base_url=site_url, trust_env=False, timeout=10) as http:
        return list(http.get("/status").raise_for_status().json()["warnings"])


@pytest.fixture
def evicting_site() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=1).prepare()
    try:
        with redis.Redis.from_url(cluster.redis[0].url) as conn:
            conn.config_set("maxmemory-policy", "allkeys-lru")
        yield cluster.launch()
    finally:
        cluster.cleanup()


def test_a_site_on_an_evicting_redis_warns_at_start_and_in_its_status(evicting_site: LocalCluster) -> None:
    site, server = evicting_site.sites[0], evicting_site.redis[0]
    warning = evicting_policy_warning(server.url, "allkeys-lru")
    logged = [json.loads(line) for line in site.log().splitlines() if line.startswith("{")]
    assert {"level": "WARNING", "logger": "msgbusd.redis_memory", "msg": warning} in [
        {name: entry.get(name) for name in ("level", "logger", "msg")} for entry in logged
    ]

    assert daemon_warnings(site.url) == [warning]
    status = gather(server.url, site.url, timeout_s=10)
    verdict = assess(status)
    assert (verdict.exit_code, verdict.problems) == (DEGRADED, (warning,))
    table = runner.invoke(app, ["status", "--redis", server.url, "--site", site.url, "--timeout", "10"])
    assert table.exit_code == DEGRADED
    assert "maxmemory-policy allkeys-lru" in table.output and f"  - {warning}" in table.output
    assert scrape(site.url)["msgbus_redis_evicting"] == 1

    with redis.Redis.from_url(server.url) as conn:
        conn.config_set("maxmemory-policy", "noeviction")
    # msgbus status reads the policy itself: the daemon's word, older, gives way at once.
    assert assess(gather(server.url, site.url, timeout_s=10)).problems == ()
    wait_until(lambda: daemon_warnings(site.url) == [], timeout_s=60, what="the daemon to read it again")
    assert scrape(site.url)["msgbus_redis_evicting"] == 0


def test_a_site_whose_redis_is_full_at_start_says_so_and_starts_once_it_has_room() -> None:
    cluster = LocalCluster(size=1).prepare()
    try:
        site, server = cluster.sites[0], cluster.redis[0]
        admin = redis.Redis.from_url(server.url)
        admin.config_set("maxmemory", 1)
        cluster.write_twins()
        with ThreadPoolExecutor(1) as starter:
            started = starter.submit(site.start)
            wait_until(lambda: f"Redis at {server.url} is full (" in site.log(), 30, "the site to say so")
            assert not started.done(), "it waits for room rather than exiting"
            admin.config_set("maxmemory", 0)
            started.result(timeout=60)
        admin.close()
        assert "has room again: msgbusd starts" in site.log()
        assert gather(server.url, site.url, timeout_s=10).daemon is not None
    finally:
        cluster.cleanup()


@pytest.fixture
def two_sites() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=2, extra_args=["--retry-delay", "0.1", "--retry-max-delay", "1"]).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def test_a_full_redis_refuses_new_requests_clearly_and_loses_none_it_took(two_sites: LocalCluster) -> None:
    site, server = two_sites.sites[0], two_sites.redis[0]
    admin = redis.Redis.from_url(server.url)
    accepted: dict[str, bytes] = {}
    refused = 0

    def says(start: str) -> bool:
        """msgbus status lists a problem that starts so."""
        problems = assess(gather(server.url, site.url, timeout_s=10)).problems
        return any(problem.startswith(start) for problem in problems)

    with RawService(two_sites.redis[1].url, "full.echo") as service, Client(server.url) as client:
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + ROOM_BYTES)
        # Requests go on being sent until Redis refuses them and msgbus status says it is full.
        while refused == 0 or not says("Redis is full ("):
            payload = uuid.uuid4().hex.encode() * (PAYLOAD_BYTES // 32)
            try:
                accepted[client.send(2, "full.echo", payload, exp=300, retries=5)] = payload
            except SiteRedisFull:
                refused += 1
            assert len(accepted) < 10_000, "Redis never filled up"

        table = runner.invoke(app, ["status", "--redis", server.url, "--site", site.url, "--timeout", "10"])
        assert table.exit_code == DEGRADED and "(FULL)" in table.output
        sent = runner.invoke(
            app, ["send", "--dst", "2", "--cmd", "full.echo", "--data", "x", "--redis", server.url]
        )
        assert sent.exit_code == EXIT_REDIS
        assert sent.output.startswith("error: the site's Redis is full (maxmemory reached): it refuses new ")
        assert sent.output.endswith("; nothing was sent\n") and sent.output.count("\n") == 1
        # Full for longer than a lease: the daemon cannot write its heartbeat and says so.
        wait_until(
            lambda: says("the daemon reports: no heartbeat in redis lately"),
            timeout_s=60,
            what="the daemon to miss its heartbeat",
        )

        admin.config_set("maxmemory", 0)
        for ret, payload in accepted.items():
            (reply,) = client.wait(ret, timeout=120)
            assert (reply.error, reply.data) == ("", payload)
    admin.close()
    assert set(service.payloads) == set(accepted.values())
    assert set(service.payloads.values()) == {1}, "each accepted request was served once"
