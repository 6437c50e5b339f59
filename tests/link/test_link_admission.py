"""Links begin at a bounded rate: a burst at once, then each at a turn of its own; an upgrade whose turn is
near waits for it, one whose turn is far is told when to dial again, and a herd so told gets in spread at
the rate, each dialer turned away once at most."""

from __future__ import annotations

import itertools
import random

import pytest

from msgbusd.link.link_admission import LinkAdmission, Turn, come_back_in_s, retry_after_header

RATE = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_begins_at_once_and_the_next_ones_wait_a_turn_each() -> None:
    clock = Clock()
    admission = LinkAdmission(RATE, burst=10, max_wait_s=1.0, clock=clock)
    turns = [admission.admit() for _ in range(15)]
    assert turns[:10] == [Turn(0.0)] * 10
    waits = [turn.wait_s for turn in turns[10:]]
    assert waits == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert admission.waited == 5 and admission.turned_away == 0


def test_the_burst_comes_back_after_a_quiet_while() -> None:
    clock = Clock()
    admission = LinkAdmission(RATE, burst=10, max_wait_s=1.0, clock=clock)
    for _ in range(20):
        admission.admit()
    clock.now += 10
    assert [admission.admit() for _ in range(10)] == [Turn(0.0)] * 10
    assert admission.admit().wait_s == pytest.approx(0.01)


def test_beyond_the_longest_wait_dialers_are_told_to_come_back_one_turn_after_another() -> None:
    clock = Clock()
    admission = LinkAdmission(RATE, burst=1, max_wait_s=0.5, clock=clock)
    turns = [admission.admit() for _ in range(60)]
    waiting = [turn for turn in turns if turn.wait_s is not None]
    told = [turn.retry_after_s for turn in turns if turn.wait_s is None]
    # One at once, then turns up to half a second away (50 of them at 100 a second).
    assert len(waiting) == 51 and max(turn.wait_s or 0 for turn in waiting) <= 0.5
    assert len(told) == 9 and admission.turned_away == 9
    assert told == sorted(told) and told[0] > 0.5
    assert [b - a for a, b in itertools.pairwise(told)] == pytest.approx([1 / RATE] * 8)


def test_a_herd_gets_in_at_the_rate_and_each_dialer_is_turned_away_once_at_most() -> None:
    clock = Clock()
    rng = random.Random(5)
    admission = LinkAdmission(RATE, burst=RATE / 2, max_wait_s=2.0, clock=clock)
    # 1,000 dialers within a tenth of a second; each one told to dial again does so when told (with the
    # second it adds of its own).
    arrivals = sorted((clock.now + rng.random() / 10, dialer) for dialer in range(1000))
    turned_away = {dialer: 0 for dialer in range(1000)}
    began_at: dict[int, float] = {}
    while arrivals:
        arrivals.sort()
        at, dialer = arrivals.pop(0)
        clock.now = at
        turn = admission.admit()
        if turn.wait_s is None:
            turned_away[dialer] += 1
            delay = come_back_in_s(retry_after_header(turn.retry_after_s), rng)
            assert delay is not None
            arrivals.append((at + delay, dialer))
        else:
            began_at[dialer] = at + turn.wait_s
    assert len(began_at) == 1000
    assert max(turned_away.values()) <= 1
    # Never faster than the rate (beyond the first burst), and all in not much more than N / rate.
    starts = sorted(began_at.values())
    first = starts[0]
    for second in range(1, 12):
        begun = sum(1 for start in starts if start < first + second)
        assert begun <= RATE / 2 + RATE * second + 1, (second, begun)
    assert starts[-1] - first < 1000 / RATE + 3


def test_retry_after_is_whole_seconds_and_the_dialer_adds_up_to_one() -> None:
    assert retry_after_header(0.4) == "0"
    assert retry_after_header(7.9) == "7"
    rng = random.Random(1)
    delays = [come_back_in_s("3", rng) for _ in range(200)]
    assert all(delay is not None and 3 <= delay < 4 for delay in delays)
    assert come_back_in_s(None) is None
    assert come_back_in_s("soon") is None
    assert come_back_in_s("-2") is None
    assert come_back_in_s("inf") is None


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LinkAdmission(0)
