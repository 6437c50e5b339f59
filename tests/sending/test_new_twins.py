"""A message to a twin the site has not talked to yet is sent from memory: it waits neither for its send queue
to be read back from Redis after the destination's lease is claimed, nor after a sender's place frees up."""

from __future__ import annotations

import pytest
import redis

from client.sync import Client
from testing.local_sites import LocalCluster, wait_until
from testing.many_twins import ManyTwinsProcess
from testing.open_connections import connections_to
from testing.site_metrics import metric, samples
from wire import keys

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

CMD = "new.echo"


def test_first_messages_to_many_new_twins_are_sent_without_reading_their_queues_back() -> None:
    harness = ManyTwinsProcess(count=300)
    cluster = LocalCluster(size=1, extra_args=["--workers", "20"], extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        site = cluster.sites[0]
        with Client(cluster.redis[0].url) as client:
            for round_number in range(2):
                rets = {twin: client.send(twin, CMD, b"%d" % round_number, exp=60) for twin in harness.up_ids}
                replies = {twin: client.wait(ret, timeout=60)[0] for twin, ret in rets.items()}
                assert {twin: (reply.error, reply.data) for twin, reply in replies.items()} == {
                    twin: ("", b"%d" % round_number) for twin in harness.up_ids
                }
        # 300 twins through 20 senders' places: most waited in line, with their message kept for them.
        assert (metric(site, "msgbus_messages_total", event="sent") or 0) == 600
        # A send that failed (the twin or Redis slow to answer on a loaded machine) is sent again from Redis:
        # only that reads a queue back.
        failures = samples(site, "msgbus_errors_total")
        retried = metric(site, "msgbus_messages_total", event="retried") or 0
        reads = metric(site, "msgbus_send_queue_reads_total")
        assert reads is not None and reads <= sum(failures.values()) + retried, (reads, failures, retried)
        per_twin = harness.stats(per_twin=True)["per_twin"]
        assert per_twin == {str(twin): {"received": 2, "answered": 2} for twin in harness.up_ids}
        # A twin's lease is freed when its sender stops (here, to give its place to another twin): only the
        # senders still running hold one, not every twin ever sent to.
        with redis.Redis.from_url(cluster.redis[0].url, decode_responses=True) as conn:
            owned = set(conn.hkeys(keys.OWNERS))
        assert {keys.LOCAL_LEASE, keys.REPLY_LEASE, keys.TIMERS_LEASE} <= owned
        assert len({name for name in owned if name.isdigit()}) <= 20
    finally:
        harness.stop()
        cluster.cleanup()


def test_a_lone_message_leaves_no_connection_open_while_a_busy_twin_keeps_its_own() -> None:
    # The twins take POSTs only (as go-rmb sites do), so that every message is a POST.
    harness = ManyTwinsProcess(count=40, links=False)
    cluster = LocalCluster(size=1, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        process = cluster.sites[0].process
        assert process is not None
        busy = harness.up_ids[0]
        with Client(cluster.redis[0].url) as client:
            rets = [client.send(twin, CMD, b"once", exp=60) for twin in harness.up_ids]
            assert all(client.wait(ret, timeout=60)[0].error == "" for ret in rets)
            # A kept connection would stay 15 s: each lone message's connection is closed once answered.
            wait_until(
                lambda: not connections_to(process.pid, harness.port), 10.0, "the lone POSTs' connections"
            )
            # Sent again within seconds, a twin is busy: its connection is kept for what comes next.
            for _ in range(3):
                reply = client.wait(client.send(busy, CMD, b"again", exp=60), timeout=60)[0]
                assert reply.error == ""
        assert connections_to(process.pid, harness.port) == {harness.range.host_of(busy): 1}
        assert harness.stats()["requests"]["post"] == len(harness.up_ids) + 3
    finally:
        harness.stop()
        cluster.cleanup()
