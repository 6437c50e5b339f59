"""A peer's state: down after a send with no answer, probed at once and then every second or two, up again
at the first answer."""

from __future__ import annotations

import itertools

from msgbusd.sending.health import PeerHealth, ProbePace, probe_backoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_that_does_not_answer_is_probed_at_once_then_every_second_or_two() -> None:
    clock = Clock()
    health = PeerHealth(probe_backoff(1.0), clock=clock)
    assert not health.is_down
    assert health.unreachable("connection refused") is True
    assert health.is_down
    assert health.seconds_until_probe() == 0.0
    # The probe fails: the next one is 1 to 1.2 s away, then 2 to 2.4 s, never more.
    assert health.unreachable("connection refused again") is False
    assert 1.0 <= health.seconds_until_probe() <= 1.2
    for _ in range(5):
        health.unreachable("still refused")
        assert 2.0 <= health.seconds_until_probe() <= 2.4
    assert health.cause == "still refused"
    clock.now += 30
    assert health.answered() == 30.0
    assert not health.is_down
    assert health.answered() is None


def test_a_peer_not_known_yet_is_probed_first_and_only_reported_once_seen_down() -> None:
    clock = Clock()
    health = PeerHealth(probe_backoff(1.0), clock=clock)
    health.unknown()
    assert health.is_down and health.seconds_until_probe() == 0.0
    assert health.answered() is None  # it answered the first probe: it never was down
    health.unknown()
    clock.now += 5
    assert health.unreachable("timeout") is True  # the first probe failed: now it is seen down
    assert health.seconds_until_probe() >= 1.0
    clock.now += 4
    assert health.answered() == 4.0


def test_a_busy_peer_is_probed_again_after_its_retry_after() -> None:
    clock = Clock()
    health = PeerHealth(probe_backoff(1.0), clock=clock)
    health.unreachable("503")
    health.busy(7.0)
    assert health.seconds_until_probe() == 7.0


def test_the_probes_of_many_peers_down_are_spread_to_the_sites_rate() -> None:
    clock = Clock()
    pace = ProbePace(50.0)
    peers = [PeerHealth(probe_backoff(1.0), pace=pace, clock=clock) for _ in range(200)]
    for health in peers:
        health.unreachable("connection refused")
    # Each first probe goes out at once, whatever the rate: a cut connection is seen back without delay.
    assert {health.seconds_until_probe() for health in peers} == {0.0}
    for health in peers:
        health.unreachable("connection refused")
    waits = sorted(health.seconds_until_probe() for health in peers)
    # The next ones: no two within 1/50 s, none before its own second, and all 200 within about 4 s.
    assert all(later - earlier >= 0.02 - 1e-9 for earlier, later in itertools.pairwise(waits))
    assert waits[0] >= 1.0
    assert 3.98 - 1e-6 <= waits[-1] - waits[0] <= 4.0 + 0.2


def test_few_peers_down_are_probed_on_their_own_schedule() -> None:
    clock = Clock()
    pace = ProbePace(50.0)
    peers = [PeerHealth(probe_backoff(1.0), pace=pace, clock=clock) for _ in range(3)]
    for health in peers:
        health.unreachable("connection refused")
    for low, high in [(1.0, 1.2), (2.0, 2.4), (2.0, 2.4)]:
        for health in peers:
            health.unreachable("connection refused")
        # Their own backoff, moved by a few slots of 1/50 s at most.
        assert all(low <= health.seconds_until_probe() <= high + 3 * 0.02 for health in peers)
        clock.now += 3.0
