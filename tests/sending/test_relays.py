"""Relays between real sites: an edge that cannot be dialed names a relay in the twin map and keeps a link
to it; a cloud site sends to the edge through the relay, which keeps what it cannot send on yet in its own
Redis and can read none of it (payloads are encrypted for the other end)."""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
import redis

from client.status import read_daemon
from msgbusd.site.instance import pick
from testing.local_sites import LocalCluster, SiteProcess, wait_until
from tests.support.answers import Answers
from tests.support.metrics import scrape
from tests.support.services import RawService
from wire import keys

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

CLOUD, RELAY, EDGE = 1, 2, 3
EACH_WAY = 200
SECRET = b"only-the-two-ends-read-this"


class RedisTap(threading.Thread):
    """Everything a Redis server is asked (MONITOR), as text."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="redis monitor")
        self._conn = redis.Redis.from_url(url)
        self.lines: list[str] = []
        self._stop_event = threading.Event()
        self._ready = threading.Event()

    def run(self) -> None:
        with self._conn.monitor() as monitor:
            self._ready.set()
            for command in monitor.listen():
                self.lines.append(str(command.get("command", "")))
                if self._stop_event.is_set():
                    return

    def start_tapping(self) -> RedisTap:
        self.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._stop_event.set()
        # One more command, so that the monitor loop sees the stop.
        redis.Redis(connection_pool=self._conn.connection_pool).ping()

    def text(self) -> str:
        return "\n".join(self.lines)


def relayed_cluster(tmp_path: Path) -> tuple[LocalCluster, SiteProcess, SiteProcess, SiteProcess]:
    cluster = LocalCluster(size=3, extra_args=["--link-after", "1"]).prepare()
    cloud, relay, edge = cluster.sites
    relay.extra_args = [*relay.extra_args, "--relay", "--event-log", str(tmp_path / "relay-events")]
    edge.advertised_address = ""
    edge.relay = relay.address
    return cluster, cloud, relay, edge


def write_twins_with(cluster: LocalCluster, twin: int, **fields: str) -> None:
    """Write the cluster's twin map with ``fields`` changed in ``twin``'s entry."""
    cluster.write_twins()
    twins = json.loads(cluster.twins_file.read_text())
    for entry in twins["twins"]:
        if entry["id"] == twin:
            entry.update(fields)
    cluster.twins_file.write_text(json.dumps(twins))


def secret_forms(payload: bytes) -> list[str]:
    """How a payload could show up in text: as it is, and base64-encoded (as in an envelope's dat)."""
    return [payload.decode(), base64.b64encode(payload).decode()[:-4]]


def test_a_relay_carries_both_ways_keeps_what_waits_through_a_crash_and_reads_none_of_it(
    tmp_path: Path,
) -> None:
    cluster, _cloud, relay, edge = relayed_cluster(tmp_path)
    cluster.launch()
    to_edge, to_cloud = Answers(cluster.redis[0].url), Answers(cluster.redis[2].url)
    tap = RedisTap(cluster.redis[1].url).start_tapping()
    try:
        with (
            RawService(cluster.redis[0].url, "cloud.echo", handler=lambda data: b"cloud:" + data) as at_cloud,
            RawService(cluster.redis[2].url, "edge.echo", handler=lambda data: b"edge:" + data) as at_edge,
            RawService(cluster.redis[1].url, "edge.echo") as at_relay,
        ):
            wait_until(lambda: "opened its uplink" in relay.log(), 20, "the edge's link to its relay")
            for n in range(EACH_WAY // 2):
                to_edge.push(EDGE, "edge.echo", SECRET + b"-a%d" % n)
                to_cloud.push(CLOUD, "cloud.echo", SECRET + b"-a%d" % n)
            wait_until(lambda: to_edge.done() and to_cloud.done(), 60, "the first half answered")
            (at_edge_end,) = read_daemon(edge.url).uplinks
            assert (at_edge_end.twin, at_edge_end.direction, at_edge_end.open) == (RELAY, "relay", True)
            # The relay lists the twins it relays.
            (at_relay_end,) = read_daemon(relay.url).uplinks
            assert (at_relay_end.twin, at_relay_end.direction, at_relay_end.open) == (EDGE, "in", True)

            # The relay crashes; what is pushed meanwhile waits at the cloud and the edge, and what the relay
            # took before it went down is kept in its Redis.
            relay.kill()
            wait_until(
                lambda: not read_daemon(edge.url).uplinks[0].open, 20, "the edge to see its link closed"
            )
            for n in range(EACH_WAY // 2, EACH_WAY):
                to_edge.push(EDGE, "edge.echo", SECRET + b"-b%d" % n)
                to_cloud.push(CLOUD, "cloud.echo", SECRET + b"-b%d" % n)
            relay.start()
            restarted_at = time.monotonic()
            wait_until(lambda: to_edge.done() and to_cloud.done(), 90, "every request answered")
            time.sleep(1.0)  # a second reply would come soon after the first
            to_edge.collect()
            to_cloud.collect()
        extra = (to_edge.extra(), to_cloud.extra())
        relay_metrics = scrape(relay.url)
        with redis.Redis.from_url(cluster.redis[1].url) as conn:
            kept = {key: conn.dump(key) or b"" for key in conn.keys("*")}
    finally:
        tap.stop()
        relay_log = relay.log()
        cluster.cleanup()

    for answers, prefix in ((to_edge, b"edge:"), (to_cloud, b"cloud:")):
        assert answers.first_replies() == answers.echoed(prefix)
    assert extra == (0, 0)
    # Executed once each, at the edge and the cloud; never at the relay.
    assert sorted(at_edge.payloads.values()) == [1] * EACH_WAY
    assert sorted(at_cloud.payloads.values()) == [1] * EACH_WAY
    assert not at_relay.payloads
    # Every request and reply went through the relay (the edge has no address) ...
    assert relay_metrics['msgbus_messages_total{event="relayed"}'] >= EACH_WAY // 2
    # Everything it held went on: nothing is left at the relay.
    assert relay_metrics['msgbus_queue_length{queue="msgbus.system.replies"}'] == 0
    monitored = tap.text()
    assert "relay:" in monitored
    # ... and the payload never reached its Redis, its log or its event log in a form it can read.
    events = "".join(path.read_text() for path in (tmp_path / "relay-events").rglob("*") if path.is_file())
    dumped = b"".join(kept.values()).decode("latin-1")
    for form in secret_forms(SECRET):
        assert form not in monitored
        assert form not in relay_log
        assert form not in events
        assert form not in dumped
    first_after = min(at for ret, at in to_edge.answered_at.items() if b"-b" in to_edge.rets[ret])
    print(f"the edge answered again {first_after - restarted_at:.1f}s after the relay was started again")
    assert first_after - restarted_at <= 10.0


def test_a_relay_refuses_a_link_in_a_twin_name_without_its_key(tmp_path: Path) -> None:
    cluster, _cloud, relay, edge = relayed_cluster(tmp_path)
    impostor = SiteProcess(
        twin=EDGE,
        redis_url=edge.redis_url,
        twins_file=edge.twins_file,
        key_type=edge.key_type,
        extra_args=edge.extra_args,
        log_path=tmp_path / "impostor.log",
    )
    cluster.sites[EDGE - 1] = impostor
    impostor.relay, impostor.advertised_address = edge.relay, ""
    try:
        # The twin map names the real edge's key; the impostor signs with another.
        write_twins_with(cluster, EDGE, account=edge.public_key.hex())
        relay.start()
        impostor.start()
        wait_until(lambda: f"not signed by twin {EDGE}" in relay.log(), 20, "the relay to refuse the link")
        assert "opened its uplink" not in relay.log()
        assert read_daemon(impostor.url).uplinks[0].open is False
    finally:
        cluster.cleanup()


def test_a_site_that_sends_posts_reaches_a_relayed_twin_at_its_relay(tmp_path: Path) -> None:
    cluster, cloud, relay, _edge = relayed_cluster(tmp_path)
    cloud.extra_args = [*cloud.extra_args, "--no-links"]
    cluster.launch()
    to_edge = Answers(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[2].url, "edge.echo", handler=lambda data: b"edge:" + data) as at_edge:
            wait_until(lambda: "opened its uplink" in relay.log(), 20, "the edge's link to its relay")
            for n in range(20):
                to_edge.push(EDGE, "edge.echo", SECRET + b"-%d" % n)
            wait_until(to_edge.done, 60, "every request answered")
        cloud_log = cloud.log()
    finally:
        cluster.cleanup()
    assert to_edge.first_replies() == to_edge.echoed(b"edge:")
    assert sorted(at_edge.payloads.values()) == [1] * 20
    assert "opened a link" not in cloud_log


def test_a_request_the_relayed_twin_cannot_decrypt_is_answered_with_why(tmp_path: Path) -> None:
    cluster, cloud, relay, edge = relayed_cluster(tmp_path)
    to_edge = Answers(cluster.redis[0].url)
    try:
        # The cloud's entry names a key that is not its own: the edge cannot decrypt what the cloud sends.
        write_twins_with(cluster, CLOUD, pk=edge.encryption_key.hex())
        for site in (cloud, relay, edge):
            site.start()
        with RawService(cluster.redis[2].url, "edge.echo") as at_edge:
            wait_until(lambda: "opened its uplink" in relay.log(), 20, "the edge's link to its relay")
            for n in range(5):
                to_edge.push(EDGE, "edge.echo", b"%d" % n)
            wait_until(to_edge.done, 30, "every request answered")
    finally:
        cluster.cleanup()
    errors = {replies[0].err for replies in to_edge.replies.values()}
    assert len(errors) == 1
    (error,) = errors
    assert error.startswith(
        f"couldn't decrypt the payload from twin {CLOUD}: not encrypted for this site's key"
    )
    assert not at_edge.payloads


def test_at_a_relay_of_two_processes_the_one_a_twins_link_lands_on_sends_it_what_both_take(
    tmp_path: Path,
) -> None:
    # Senders reach either process of the relay; the lease of sending to the edge would go to WINNER by
    # rendezvous hashing, but the edge's link is open to the other one, started first.
    cluster = LocalCluster(size=3, processes=2, extra_args=["--link-after", "1"]).prepare()
    cloud, relay, edge = cluster.sites
    (sibling,) = cluster.siblings[RELAY]
    cluster.siblings[CLOUD], cluster.siblings[EDGE] = [], []
    relay.extra_args = [*relay.extra_args, "--relay", "--instance", "relay-a"]
    sibling.extra_args = [*sibling.extra_args, "--relay", "--instance", "relay-b"]
    winner = pick(str(EDGE), ["relay-a", "relay-b"])
    (first, first_name), second = (
        ((sibling, "relay-b"), relay) if winner == "relay-a" else ((relay, "relay-a"), sibling)
    )
    edge.advertised_address = ""
    edge.relay = relay.address
    to_edge = Answers(cluster.redis[0].url)
    try:
        cluster.write_twins()
        first.start()
        edge.start()
        wait_until(lambda: "opened its uplink" in first.log(), 20, "the edge's link to its relay")
        second.start()
        cloud.start()
        with redis.Redis.from_url(cluster.redis[1].url) as conn:
            wait_until(lambda: conn.zcard(keys.INSTANCES) == 2, 20, "both relay processes live")
        with RawService(cluster.redis[2].url, "edge.echo", handler=lambda data: b"edge:" + data) as at_edge:
            for n in range(100):
                to_edge.push(EDGE, "edge.echo", b"%d" % n)
            wait_until(to_edge.done, 60, "every request answered")
        with redis.Redis.from_url(cluster.redis[1].url, decode_responses=True) as conn:
            sender = conn.hget(keys.OWNERS, str(EDGE))
    finally:
        cluster.cleanup()
    assert all(replies[0].err == "" for replies in to_edge.replies.values())
    assert sorted(at_edge.payloads.values()) == [1] * 100
    assert sender == first_name != winner
