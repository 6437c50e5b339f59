"""Delays between attempts, and how long a message waiting for a peer that is down keeps its tries."""

from __future__ import annotations

import random

from msgbusd.sending.schedule import Schedule
from msgbusd.sending.send_items import SendItem
from wire.backoff import Backoff
from wire.envelope import Envelope


def test_delays_double_up_to_the_maximum_and_jitter_only_lengthens_them() -> None:
    backoff = Backoff(5.0, 60.0, rng=random.Random(1))
    assert [backoff.nominal_s(n) for n in range(1, 7)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    for failures in range(1, 10):
        delay = backoff.delay_s(failures)
        assert backoff.nominal_s(failures) <= delay <= 1.2 * backoff.nominal_s(failures)


def test_total_adds_the_nominal_delays_of_the_tries_left() -> None:
    backoff = Backoff(5.0, 60.0)
    assert backoff.total_s(1, 8) == 5 + 10 + 20 + 40 + 60 + 60 + 60 + 60
    assert backoff.total_s(3, 4) == 20 + 40
    assert backoff.total_s(1, 0) == 0.0
    assert backoff.total_s(1, 10_000) == 5 + 10 + 20 + 40 + 60 * 9_996
    assert Backoff(0.0, 0.0).total_s(1, 5) == 0.0


def waiting(hold_offline: bool) -> Schedule:
    # give_up_at reads neither Redis nor the send queues.
    return Schedule(None, None, backoff=Backoff(5.0, 60.0), hold_offline=hold_offline)  # type: ignore[arg-type]


def request(retries: int, failures: int) -> SendItem:
    env = Envelope(uid="2.1", cmd="x", dst=(2,), retries=retries)
    return SendItem("req:2.1", "/zbus-remote", env, original=env, failures=failures)


def test_a_waiting_request_gives_up_when_its_tries_would_have_run_out() -> None:
    # Never sent (the probe was its first attempt) or sent once: the same retries are left.
    assert waiting(False).give_up_at(request(8, 0), now=100.0) == 100.0 + 315.0
    assert waiting(False).give_up_at(request(8, 1), now=100.0) == 100.0 + 315.0
    assert waiting(False).give_up_at(request(8, 3), now=100.0) == 100.0 + 20 + 40 + 60 * 4
    assert waiting(False).give_up_at(request(0, 1), now=100.0) == 100.0


def test_with_hold_offline_a_request_waits_and_a_reply_gives_up_at_its_deadline() -> None:
    assert waiting(True).give_up_at(request(8, 1), now=100.0) is None
    reply = SendItem("rep:2|1.1", "/zbus-reply", Envelope(uid="1.1"), state={"deadline": 160.0})
    assert waiting(True).give_up_at(reply, now=100.0) == 160.0
    assert waiting(False).give_up_at(reply, now=100.0) == 160.0
