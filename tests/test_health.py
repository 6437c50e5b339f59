"""A peer's state: down after a send with no answer, probed at once and then every second or two, up again
at the first answer."""

from __future__ import annotations

from msgbusd.health import PeerHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_that_does_not_answer_is_probed_at_once_then_every_second_or_two() -> None:
    clock = Clock()
    health = PeerHealth(1.0, clock=clock)
    assert not health.is_down(2)
    assert health.unreachable(2, "connection refused") is True
    assert health.is_down(2) and health.down_count() == 1
    assert health.seconds_until_probe(2) == 0.0
    # The probe fails: the next one is 1 to 1.2 s away, then 2 to 2.4 s, never more.
    assert health.unreachable(2, "connection refused again") is False
    assert 1.0 <= health.seconds_until_probe(2) <= 1.2
    for _ in range(5):
        health.unreachable(2, "still refused")
        assert 2.0 <= health.seconds_until_probe(2) <= 2.4
    assert health.last_cause(2) == "still refused"
    clock.now += 30
    assert health.answered(2) == 30.0
    assert not health.is_down(2) and health.down_count() == 0
    assert health.answered(2) is None


def test_a_peer_not_known_yet_is_probed_first_and_only_reported_once_seen_down() -> None:
    clock = Clock()
    health = PeerHealth(1.0, clock=clock)
    health.unknown(3)
    assert health.is_down(3) and health.seconds_until_probe(3) == 0.0
    assert health.answered(3) is None  # it answered the first probe: it never was down
    health.unknown(3)
    clock.now += 5
    assert health.unreachable(3, "timeout") is True  # the first probe failed: now it is seen down
    assert health.seconds_until_probe(3) >= 1.0
    clock.now += 4
    assert health.answered(3) == 4.0


def test_a_busy_peer_is_probed_again_after_its_retry_after() -> None:
    clock = Clock()
    health = PeerHealth(1.0, clock=clock)
    health.unreachable(4, "503")
    health.busy(4, 7.0)
    assert health.seconds_until_probe(4) == 7.0
