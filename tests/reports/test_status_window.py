"""The daemon's side of ``msgbus status``: the last minute of traffic, each peer's state and activity."""

from __future__ import annotations

import json

import pytest

from msgbusd.reports.metrics import Metrics
from msgbusd.reports.peer_activity import PeerActivityLog
from msgbusd.reports.recent_traffic import LatencyWindow, RateWindow, RecentTraffic
from msgbusd.sending.health import PeerHealth, probe_backoff
from msgbusd.sending.peer_report import PeerReport
from wire.site_status import Traffic


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_rate_window_counts_the_last_minute_and_forgets_what_is_older() -> None:
    clock = Clock()
    window = RateWindow(60, clock=clock)
    window.add(3)
    clock.now += 0.5
    window.add()
    clock.now += 30
    window.add(6)
    assert window.total() == 10
    assert window.per_second() == pytest.approx(10 / 30.5)
    clock.now += 30
    assert window.total() == 6, "the first second's 4 are more than a minute old"
    assert window.per_second() == pytest.approx(6 / 60), "a full minute is covered now"
    clock.now += 60
    assert window.total() == 0


def test_a_slot_is_reset_when_its_second_comes_round_again() -> None:
    clock = Clock()
    window = RateWindow(60, clock=clock)
    window.add(5)
    clock.now += 60
    window.add(1)
    assert window.total() == 1


def test_a_rate_is_never_divided_by_less_than_a_second() -> None:
    clock = Clock()
    window = RateWindow(60, clock=clock)
    window.add(4)
    assert window.per_second() == 4.0


def test_latency_percentiles_are_nearest_rank_over_the_window() -> None:
    clock = Clock()
    window = LatencyWindow(60, clock=clock)
    assert window.percentiles(50, 99) == [None, None]
    for millis in range(1, 101):
        window.add(millis / 1000)
    assert window.percentiles(50, 99, 100) == [0.05, 0.099, 0.1]
    clock.now += 61
    window.add(7.0)
    assert window.percentiles(50, 99) == [7.0, 7.0], "samples older than the window are dropped"
    assert window.count.total() == 1


def test_beyond_its_bound_a_latency_window_keeps_the_newest_samples_and_counts_them_all() -> None:
    clock = Clock()
    window = LatencyWindow(60, max_samples=10, clock=clock)
    for index in range(100):
        window.add(float(index))
    assert window.percentiles(0.1, 100) == [90.0, 99.0]
    assert window.count.total() == 100


def test_the_daemons_metrics_feed_the_last_minute() -> None:
    metrics = Metrics()
    metrics.message("sent", 3)
    metrics.message("reply_sent", 2)
    metrics.message("received", 4)
    metrics.message("reply_received", 4)  # already counted among the messages received
    metrics.message("accepted", 9)
    metrics.observe_round_trip(0.010)
    metrics.observe_round_trip(0.030)
    snapshot = metrics.recent.snapshot()
    assert snapshot.round_trips == 2
    assert (snapshot.round_trip_p50_s, snapshot.round_trip_p99_s) == (0.010, 0.030)
    assert metrics.recent.sent.total() == 5
    assert metrics.recent.received.total() == 4
    assert set(snapshot.to_json()) == {
        "window_s",
        "sent_per_s",
        "received_per_s",
        "round_trips",
        "round_trips_per_s",
        "round_trip_p50_s",
        "round_trip_p99_s",
    }


def test_an_empty_minute_has_no_percentiles() -> None:
    snapshot = RecentTraffic().snapshot()
    assert (snapshot.round_trips, snapshot.round_trip_p50_s, snapshot.round_trip_p99_s) == (0, None, None)
    assert snapshot.sent_per_s == 0.0


def test_the_traffic_reads_back_as_the_daemon_wrote_it_and_nothing_else() -> None:
    clock = Clock(100.0)
    traffic = RecentTraffic(clock=clock)
    traffic.sent.add(3)
    traffic.round_trips.add(0.004)
    clock.now += 2
    snapshot = traffic.snapshot()
    assert Traffic.from_json(json.loads(json.dumps(snapshot.to_json()))) == snapshot
    with pytest.raises(TypeError):
        Traffic.from_json({**snapshot.to_json(), "round_trips": True})
    with pytest.raises(KeyError):
        Traffic.from_json({"window_s": 60.0})


def test_a_peers_state_says_since_when_it_is_down_why_and_when_it_is_probed_next() -> None:
    clock = Clock(100.0)
    health = PeerHealth(probe_backoff(1.0), clock=clock)
    assert health.state().state == "up"
    health.unreachable("connection refused")
    clock.now += 3
    health.unreachable("connection refused again")
    state = health.state()
    assert (state.state, state.down_for_s, state.cause, state.probes) == (
        "down",
        3.0,
        "connection refused again",
        1,
    )
    assert 1.0 <= state.next_probe_in_s <= 1.2


def test_a_peer_not_known_yet_is_probing() -> None:
    health = PeerHealth(probe_backoff(1.0), clock=Clock())
    health.unknown()
    assert health.state().state == "probing"
    assert health.state().cause == "not probed yet"


def test_a_peer_report_gives_unix_times() -> None:
    clock = Clock(50.0)
    health = PeerHealth(probe_backoff(1.0), clock=clock)
    health.unreachable("timed out")
    clock.now += 12
    activity = PeerActivityLog(clock=Clock(5000.0))
    activity.failed(7, "timed out")
    report = PeerReport.of(7, health.state(), activity.active_since(0)[7], now=5000.0)
    assert (report.state, report.down_since, report.cause) == ("down", 4988.0, "timed out")
    assert (report.last_error, report.last_error_at, report.last_sent_at) == ("timed out", 5000.0, None)
    up = PeerReport.of(8, PeerHealth(probe_backoff(1.0)).state(), None, now=5000.0)
    assert (up.state, up.down_since, up.next_probe_in_s, up.last_error) == ("up", None, None, "")


def test_the_activity_log_keeps_the_most_recently_active_peers() -> None:
    clock = Clock(0.0)
    activity = PeerActivityLog(max_peers=2, clock=clock)
    activity.sent(1)
    clock.now = 10
    activity.sent(2)
    clock.now = 20
    activity.failed(1, "refused")
    clock.now = 30
    activity.sent(3)
    assert set(activity.active_since(0)) == {1, 3}, "twin 2 was the least recently active"
    assert set(activity.active_since(25)) == {3}
    record = activity.active_since(0)[1]
    assert (record.last_sent_at, record.last_error, record.last_error_at) == (0.0, "refused", 20.0)
