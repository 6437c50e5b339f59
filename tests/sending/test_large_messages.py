"""Large messages sent beside the others: which are set aside, how many go at once, and, between real
sites, that a mix of large and small messages is answered exactly once, also when the receiving daemon is
killed while large ones are on their way."""

from __future__ import annotations

import time

import pytest

from msgbusd.sending.large_messages import LargeMessages
from msgbusd.sending.send_items import SendItem
from testing.local_sites import LocalCluster, wait_until
from tests.support.answers import Answers
from tests.support.services import RawService
from wire.envelope import Envelope


def item(entry: str, size: int) -> SendItem:
    return SendItem(entry=entry, path="/zbus-remote", envelope=Envelope(dat="x" * size))


def test_large_messages_are_set_aside_two_at_a_time_the_rest_in_order() -> None:
    large = LargeMessages(threshold_bytes=100, slots=2)
    items = [item("req:s1", 10), item("req:b1", 101), item("req:b2", 500), item("req:s2", 100)]
    items.append(item("req:b3", 200))
    batch, start = large.set_aside(items)
    assert [it.entry for it in batch] == ["req:s1", "req:s2"]
    assert [it.entry for it in start] == ["req:b1", "req:b2"]
    assert set(large.entries) == {"req:b1", "req:b2", "req:b3"}
    assert large.entries[-1] == "req:b3" and "req:b3" in large and large.busy
    # Read again from the queue, what is set aside is neither sent with the batch nor started twice.
    assert large.set_aside(items[1:3]) == ([], [])
    # A slot frees: the waiting one goes next.
    assert large.finished("req:b1", delivered=True) == "req:b3"
    assert large.finished("req:b2", delivered=True) is None
    assert large.finished("req:b3", delivered=True) is None
    assert not large.busy


def test_a_large_message_that_did_not_get_through_sends_the_waiting_ones_back_to_the_queue() -> None:
    large = LargeMessages(threshold_bytes=1, slots=1)
    _, start = large.set_aside([item("req:a", 2), item("req:b", 2), item("req:c", 2)])
    assert [it.entry for it in start] == ["req:a"]
    assert large.finished("req:a", delivered=False) is None
    # The sender reads them from its queue again.
    assert not large.busy


def test_nothing_is_set_aside_when_the_threshold_is_zero() -> None:
    large = LargeMessages(threshold_bytes=0)
    items = [item("req:a", 10_000_000)]
    assert large.set_aside(items) == (items, [])


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_mix_of_large_and_small_messages_is_answered_once_through_a_receiver_killed_midway() -> None:
    cluster = LocalCluster(
        size=2, extra_args=["--large-message-bytes", "2000", "--retry-delay", "0.2", "--retry-max-delay", "1"]
    ).start()
    receiver = cluster.sites[1]
    try:
        answers = Answers(cluster.redis[0].url)
        with RawService(cluster.redis[1].url, "mix.echo", handler=lambda data: data[:8]) as service:
            for n in range(300):
                size = 200_000 if n % 10 == 3 else 20
                answers.push(2, "mix.echo", b"%07d|" % n + b"x" * size)
                if n == 120:
                    wait_until(lambda: len(service.payloads) >= 60, 30, "the first requests served")
                    receiver.kill()
                    receiver.start()
            wait_until(answers.done, 90, "every answer")
            time.sleep(0.5)  # a second reply would come soon after the first
            assert answers.extra() == 0
        expected = {ret: ("", payload[:8]) for ret, payload in answers.rets.items()}
        assert answers.first_replies() == expected
        # Each executed once (the receiver keeps one of what is sent twice).
        assert sorted(service.payloads.values()) == [1] * 300
    finally:
        cluster.cleanup()
