"""More twins with work than --workers: the others wait in line (their work in Redis) and idle senders make
room at once, so hundreds of twins are served by five senders without waiting for any to idle out."""

from __future__ import annotations

import threading

import pytest

from client.sync import Client
from testing.local_sites import LocalCluster, wait_until
from testing.many_twins import ManyTwinsProcess
from testing.site_metrics import metric

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

CMD = "many.echo"


def test_twins_beyond_the_senders_places_wait_in_line_and_are_all_served() -> None:
    harness = ManyTwinsProcess(count=200, down=20)
    cluster = LocalCluster(size=1, extra_args=["--workers", "5"], extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        up, down = harness.up_ids, harness.down_twin_ids
        senders, waiting, sampling = list[float](), list[float](), threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                senders.append(metric(cluster.sites[0], "msgbus_senders") or 0.0)
                waiting.append(metric(cluster.sites[0], "msgbus_senders_waiting") or 0.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with Client(cluster.redis[0].url) as client:
            for round_number in range(2):
                rets = {
                    twin: client.send(twin, CMD, b"%d" % round_number, exp=60, retries=0)
                    for twin in up + down
                }
                # A sender idles 30 s before it stops on its own: 200 twins through 5 places in far less
                # than that means idle senders gave their places away.
                replies = {twin: client.wait(ret, timeout=25)[0] for twin, ret in rets.items()}
                assert {twin: (replies[twin].error, replies[twin].data) for twin in up} == {
                    twin: ("", b"%d" % round_number) for twin in up
                }
                for twin in down:
                    error = replies[twin].error
                    assert error.startswith("all retries done: ") and f"twin {twin} " in error, error
        sampling.set()
        sampler.join()
        assert max(senders) <= 5
        assert max(waiting) > 0
        per_twin = harness.stats(per_twin=True)["per_twin"]
        assert per_twin == {str(twin): {"received": 2, "answered": 2} for twin in up}
    finally:
        harness.stop()
        cluster.cleanup()


def test_a_twin_waiting_for_a_place_stops_one_idle_sender_not_all() -> None:
    harness = ManyTwinsProcess(count=30)
    cluster = LocalCluster(size=1, extra_args=["--workers", "20"], extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        site = cluster.sites[0]
        first, later = harness.up_ids[:20], harness.up_ids[20:]
        with Client(cluster.redis[0].url) as client:
            rets = [client.send(twin, CMD, b"first", exp=60) for twin in first]
            assert all(client.wait(ret, timeout=30)[0].error == "" for ret in rets)
            # Twenty senders idle, holding every place: each new twin takes the place of one of them.
            wait_until(lambda: metric(site, "msgbus_senders") == 20, 10, "twenty senders")
            for number, twin in enumerate(later, start=1):
                reply = client.wait(client.send(twin, CMD, b"later", exp=60), timeout=30)[0]
                assert (reply.error, reply.data) == ("", b"later")
                assert metric(site, "msgbus_senders") == 20, f"after {number} new twins"
        assert metric(site, "msgbus_senders_waiting") == 0
    finally:
        harness.stop()
        cluster.cleanup()
