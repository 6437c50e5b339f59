"""A site whose peers are mostly down: its probes keep to --probe-rate however many are down, the twins
that answer get their messages all the while, and each message to a twin that is down gets its error when
its tries would have run out, not at the next probe (which, with hundreds down, is far away)."""

from __future__ import annotations

import time

import pytest

from client.sync import Client
from testing.local_sites import LocalCluster, wait_until
from testing.many_twins import ManyTwinsProcess
from testing.site_metrics import metric, peers_probed

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]

CMD = "many.echo"
PROBE_RATE = 20


def probes(cluster: LocalCluster) -> float:
    return metric(cluster.sites[0], "msgbus_messages_total", event="probed") or 0.0


def test_probes_of_hundreds_of_twins_down_keep_to_the_rate_while_the_others_are_answered() -> None:
    harness = ManyTwinsProcess(count=500, down=400)
    site_args = ["--hold-offline", "--probe-rate", str(PROBE_RATE)]
    cluster = LocalCluster(size=1, extra_args=site_args, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        down, up = harness.down_twin_ids, harness.up_ids
        with Client(cluster.redis[0].url) as client:
            for twin in down:
                client.send(twin, CMD, b"held", exp=120)
            # Each twin found down is probed once at once (as senders' places free up); the next probes are
            # paced.
            wait_until(lambda: peers_probed(cluster.sites[0]) == len(down), 30, "a first probe of each")
            start_count, started = probes(cluster), time.monotonic()
            for round_number in range(3):
                rets = {twin: client.send(twin, CMD, b"%d" % round_number, exp=60) for twin in up}
                replies = {twin: client.wait(ret, timeout=30)[0] for twin, ret in rets.items()}
                assert {twin: (r.error, r.data) for twin, r in replies.items()} == {
                    twin: ("", b"%d" % round_number) for twin in up
                }
            time.sleep(max(0.0, 4.0 - (time.monotonic() - started)))
            made, window_s = probes(cluster) - start_count, time.monotonic() - started
        # Unpaced, 400 twins probed every 2 s would be 200 a second. (A few more than the rate's count: a
        # probe is counted once it is answered, so the window's edges move by a probe or two.)
        assert made <= PROBE_RATE * window_s + 3, (made, window_s)
        assert made >= 1
    finally:
        harness.stop()
        cluster.cleanup()


def test_a_message_to_a_twin_that_is_down_fails_when_its_tries_run_out_not_at_the_next_probe() -> None:
    harness = ManyTwinsProcess(count=300, down=250)
    # Probes 2 a second over 250 twins: each is probed every two minutes or so.
    site_args = ["--probe-rate", "2", "--retry-delay", "1", "--retry-max-delay", "2"]
    cluster = LocalCluster(size=1, extra_args=site_args, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        down = harness.down_twin_ids
        with Client(cluster.redis[0].url) as client:
            sent_at = time.time()
            # Three tries: the send that found the twin down, then two more spaced by 1 s and 2 s.
            rets = {twin: client.send(twin, CMD, b"x", exp=120, retries=2) for twin in down}
            replies = {twin: client.wait(ret, timeout=60)[0] for twin, ret in rets.items()}
        for twin, reply in replies.items():
            assert reply.error.startswith(f"all retries done: twin {twin} is unreachable ("), reply.error
        # Not before the tries would have run out (the envelope's `now` is when the error was made).
        assert min(reply.envelope.now for reply in replies.values()) >= int(sent_at + 1 + 2) - 1
    finally:
        harness.stop()
        cluster.cleanup()
