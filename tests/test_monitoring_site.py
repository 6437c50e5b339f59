"""A live site's /metrics, after a round trip between two real sites, passes `promtool check metrics`, and
exports every metric the alert rules and docs/operations.md name, without `*_created` series."""

from __future__ import annotations

import subprocess

import httpx
import redis

from testing.local_sites import LocalCluster
from tests.reports.test_metrics_catalogue import documented
from tests.support.services import RawService, pop_replies, push_request
from tests.test_monitoring import promtool_binary


def test_a_live_sites_metrics_pass_promtool() -> None:
    cluster = LocalCluster(size=2).start()
    try:
        site1 = redis.Redis.from_url(cluster.redis[0].url)
        with RawService(cluster.redis[1].url, "echo.metrics"):
            ret = push_request(site1, [2], "echo.metrics", b"ping", exp=30)
            (reply,) = pop_replies(site1, ret, 1)
        assert reply.err == ""
        site1.close()
        with httpx.Client(base_url=cluster.sites[0].url, trust_env=False, timeout=10) as http:
            text = http.get("/metrics").raise_for_status().text
    finally:
        cluster.cleanup()
    checked = subprocess.run(
        [promtool_binary(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "_created" not in text
    # The MQTT counters exist only on edge sites with --mqtt, the twin cache's with a chain or HTTP
    # resolver (these sites read a twin file).
    expected = set(documented()) - {"msgbus_router_mqtt_total", "msgbus_twin_cache_total"}
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert families == expected
