"""``msgbus status`` without a site: which problems a status has, its exit code, the table and the JSON."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, replace

import pytest

from client.status import (
    DaemonView,
    DeadLetter,
    PeerView,
    QueueDepth,
    RedisView,
    SiteStatus,
    UplinkView,
    merge_peers,
    parse_report,
)
from client.status_check import DEGRADED, HEALTHY, UNREACHABLE, assess, format_duration
from client.status_render import render_json, render_table, wants_colour
from wire import keys
from wire.site_status import Traffic

NOW = 1_800_000_000.0
TRAFFIC = Traffic(60.0, 4.5, 4.0, 120, 2.0, 0.0031, 0.0098)


def redis_view(**changes: object) -> RedisView:
    view = RedisView(
        twin=1,
        used_memory=1_500_000,
        used_memory_human="1.43M",
        maxmemory=0,
        maxmemory_human="0B",
        queues=tuple(QueueDepth(queue, 0, 0) for queue in keys.SYSTEM_QUEUES),
        backlog=2,
        replies=0,
        retries_scheduled=0,
        overdue=0,
        dead_letters=0,
        newest_dead_letters=(),
        send_queues={2: 0},
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def daemon_view(*peers: PeerView, **changes: object) -> DaemonView:
    view = DaemonView(
        twin=1,
        version="0.1.0",
        started_at=NOW - 200,
        uptime_s=200.0,
        problems=(),
        inflight=0,
        links_open=1,
        peers=peers or (PeerView(2, "up", None, last_sent_at=NOW - 1),),
        traffic=TRAFFIC,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def site(redis: RedisView | None = None, daemon: DaemonView | None = None, **changes: object) -> SiteStatus:
    status = SiteStatus(
        checked_at=NOW,
        redis_url="redis://127.0.0.1:6379/0",
        site_url="http://127.0.0.1:8051",
        redis=redis,
        daemon=daemon,
        peers=merge_peers(daemon, redis),
    )
    return replace(status, **changes)  # type: ignore[arg-type]


def peer_row(table: str, twin: int) -> str:
    (row,) = [line for line in table.splitlines() if line.split()[:1] == [str(twin)]]
    return row


DOWN_PEER = PeerView(
    3,
    "down",
    None,
    down_since=NOW - 42,
    cause="couldn't reach twin 3 at http://127.0.0.1:9/zbus-batch: connection refused",
    probes=12,
    next_probe_in_s=1.5,
    last_error="couldn't reach twin 3 at http://127.0.0.1:9/zbus-batch: connection refused",
    last_error_at=NOW - 1,
)


def test_a_site_whose_redis_and_daemon_answer_with_nothing_wrong_is_healthy() -> None:
    status = site(redis_view(), daemon_view())
    verdict = assess(status)
    assert (verdict.exit_code, verdict.word, verdict.problems) == (HEALTHY, "healthy", ())
    table = render_table(status, verdict, colour=False)
    assert "msgbus status: twin 1, msgbusd 0.1.0, up 3m20s  HEALTHY (exit 0)" in table
    assert "no problems" in table
    assert "round trips        120 (2.00/s), p50 3.1ms, p99 9.8ms" in table
    assert "\033[" not in table


def test_the_json_is_one_object_with_every_part() -> None:
    status = site(redis_view(send_queues={3: 4}), daemon_view(DOWN_PEER))
    document = json.loads(render_json(status, assess(status)))
    assert set(document) == {
        "status",
        "exit_code",
        "problems",
        "checked_at",
        "daemon",
        "redis",
        "peers",
        "uplinks",
        "traffic",
    }
    assert (document["status"], document["exit_code"]) == ("degraded", 1)
    assert document["daemon"]["reachable"] is True and document["daemon"]["twin"] == 1
    assert document["redis"]["queues"][0] == {"name": keys.LOCAL, "waiting": 0, "processing": 0}
    assert document["redis"]["send_queues"] == {"3": 4}
    (peer,) = document["peers"]
    assert (peer["twin"], peer["state"], peer["queue"], peer["down_since"]) == (3, "down", 4, NOW - 42)
    assert document["traffic"]["round_trip_p99_s"] == 0.0098


def test_a_peer_down_is_degraded_and_says_since_when_why_and_what_waits() -> None:
    status = site(redis_view(send_queues={3: 4}), daemon_view(DOWN_PEER))
    verdict = assess(status)
    assert verdict.exit_code == DEGRADED
    assert verdict.problems == (
        "twin 3 is down for 42s: couldn't reach twin 3 at http://127.0.0.1:9/zbus-batch: connection refused; "
        "4 message(s) wait for it",
    )
    table = render_table(status, verdict, colour=False).splitlines()
    row = peer_row("\n".join(table), 3)
    assert row.split()[1] == "down"
    assert "in 1.5s" in row and "    4  " in row
    error_line = table[table.index(row) + 1]
    assert error_line.strip() == f"last error 1s ago: {DOWN_PEER.last_error}"


def test_a_peer_not_known_yet_is_no_problem() -> None:
    probing = PeerView(4, "probing", None, down_since=NOW - 1, cause="not probed yet", next_probe_in_s=0.0)
    assert assess(site(redis_view(), daemon_view(probing))).exit_code == HEALTHY


def test_a_daemon_that_does_not_answer_is_unreachable_and_redis_is_still_shown() -> None:
    status = site(
        redis_view(queues=(QueueDepth(keys.LOCAL, 5, 1), *redis_view().queues[1:]), send_queues={2: 3}),
        None,
        daemon_error="http://127.0.0.1:8051/status: [Errno 111] Connection refused",
    )
    verdict = assess(status)
    assert verdict.exit_code == UNREACHABLE
    assert verdict.problems[0].startswith("the daemon does not answer (http://127.0.0.1:8051/status:")
    assert "nothing is sent, received or delivered" in verdict.problems[0]
    table = render_table(status, verdict, colour=False)
    assert "daemon  http://127.0.0.1:8051  DOES NOT ANSWER" in table
    assert "msgbus status: twin 1  UNREACHABLE (exit 2)" in table
    (local,) = [line for line in table.splitlines() if line.strip().startswith(keys.LOCAL)]
    assert local.split()[1:] == ["5", "1"]
    assert peer_row(table, 2).split()[:3] == ["2", "unknown", "3"]


def test_a_daemon_that_refuses_the_report_is_unreachable_too() -> None:
    status = site(redis_view(), None, daemon_error="answered 403", daemon_answered=True)
    verdict = assess(status)
    assert verdict.exit_code == UNREACHABLE
    assert verdict.problems == ("the daemon gave no status report: answered 403",)


def test_what_the_daemon_warns_of_makes_the_site_degraded_and_is_listed_as_said() -> None:
    warning = "the event log cannot be written (No space left on device): 12 event(s) dropped"
    report = {**to_report(daemon_view()), "warnings": [warning]}
    status = site(redis_view(), parse_report(report))
    verdict = assess(status)
    assert (verdict.exit_code, verdict.problems) == (DEGRADED, (warning,))
    assert warning in render_table(status, verdict, colour=False)
    assert json.loads(render_json(status, verdict))["daemon"]["warnings"] == [warning]


def test_a_report_without_warnings_from_an_older_daemon_has_none() -> None:
    report = to_report(daemon_view())
    del report["warnings"]
    assert parse_report(report).warnings == ()


def to_report(view: DaemonView) -> dict[str, object]:
    """``view`` as the daemon's ``/status`` JSON."""
    report = json.loads(json.dumps(asdict(view)))
    report["traffic"] = view.traffic.to_json()
    return report  # type: ignore[no-any-return]


def test_a_redis_that_does_not_answer_is_unreachable() -> None:
    daemon = daemon_view(problems=("redis unreachable: no answer within 1s",))
    status = site(None, daemon, redis_error="Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    verdict = assess(status)
    assert verdict.exit_code == UNREACHABLE
    assert verdict.problems == (
        "Redis at redis://127.0.0.1:6379/0 does not answer: Error 111 connecting to 127.0.0.1:6379. "
        "Connection refused.",
        "the daemon reports: redis unreachable: no answer within 1s",
    )
    row = peer_row(render_table(status, verdict, colour=False), 2)
    assert row.split()[1:3] == ["up", "?"], "no queue length without Redis"
    assert json.loads(render_json(status, verdict))["redis"] == {
        "url": "redis://127.0.0.1:6379/0",
        "reachable": False,
        "error": "Error 111 connecting to 127.0.0.1:6379. Connection refused.",
    }


@pytest.mark.parametrize(
    ("redis", "daemon", "problem"),
    [
        (
            redis_view(overdue=2),
            daemon_view(),
            "2 request(s) more than 5s past their deadline have no outcome",
        ),
        (
            redis_view(dead_letters=7, newest_dead_letters=(DeadLetter(NOW - 90, keys.LOCAL, "not json"),)),
            daemon_view(),
            f"an item was dead-lettered 1m30s ago ({keys.LOCAL}: not json)",
        ),
        (redis_view(maxmemory=1_600_000), daemon_view(), "Redis uses 94% of its maxmemory"),
        (
            redis_view(twin=2),
            daemon_view(),
            "the daemon is twin 1 but this Redis was last used by twin 2",
        ),
        (
            redis_view(),
            daemon_view(problems=("loop msgbus.system.local has not run for 20s",)),
            "the daemon reports: loop msgbus.system.local has not run for 20s",
        ),
    ],
)
def test_what_makes_a_site_degraded(redis: RedisView, daemon: DaemonView, problem: str) -> None:
    verdict = assess(site(redis, daemon))
    assert verdict.exit_code == DEGRADED
    (found,) = verdict.problems
    assert found.startswith(problem)


def test_old_dead_letters_are_shown_but_are_no_problem() -> None:
    letters = (DeadLetter(NOW - 7200, keys.REPLY, "reply has no destination twin"),)
    status = site(redis_view(dead_letters=1, newest_dead_letters=letters), daemon_view())
    verdict = assess(status)
    assert verdict.exit_code == HEALTHY
    assert f"2h00m ago  {keys.REPLY}: reply has no destination twin" in render_table(
        status, verdict, colour=False
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_without_no_color() -> None:
    assert wants_colour(Terminal(), {})
    assert not wants_colour(Terminal(), {"NO_COLOR": "1"})
    assert wants_colour(Terminal(), {"NO_COLOR": ""}), "an empty NO_COLOR does not count"
    assert not wants_colour(io.StringIO(), {})


def test_a_coloured_table_marks_the_verdict_and_the_states() -> None:
    status = site(redis_view(), daemon_view(DOWN_PEER))
    table = render_table(status, assess(status), colour=True)
    assert "\033[33mDEGRADED (exit 1)\033[0m" in table
    assert "\033[31mdown   \033[0m" in table


def test_the_daemons_report_is_read_field_by_field() -> None:
    report = {
        "twin": 1,
        "version": "0.1.0",
        "started_at": NOW - 5,
        "uptime_s": 5,
        "problems": [],
        "inflight": 0,
        "links_open": 0,
        "peers": [{"twin": 3, "state": "down", "down_since": NOW - 2, "cause": "timed out", "probes": 1}],
        "traffic": {
            "window_s": 5,
            "sent_per_s": 0,
            "received_per_s": 0,
            "round_trips": 0,
            "round_trips_per_s": 0,
            "round_trip_p50_s": None,
            "round_trip_p99_s": None,
        },
    }
    view = parse_report(report)
    assert view.peers == (PeerView(3, "down", None, down_since=NOW - 2, cause="timed out", probes=1),)
    with pytest.raises(KeyError):
        parse_report({**report, "traffic": {}})
    with pytest.raises(TypeError):
        parse_report({**report, "peers": [{"twin": 3, "state": "up", "down_since": "yesterday"}]})


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (3599, "59m59s"),
        (7260, "2h01m"),
        (90000, "1d01h"),
        (-3, "0s"),
    ],
)
def test_durations_show_two_units_at_most(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown


def test_uplinks_are_listed_and_a_closed_one_is_a_problem() -> None:
    uplinks = (
        UplinkView(5, "out", True, since=NOW - 30),
        UplinkView(7, "in", False, since=NOW - 90),
        UplinkView(8, "in", True, since=NOW - 5),
    )
    status = site(redis_view(send_queues={7: 12}), daemon_view(uplinks=uplinks))
    verdict = assess(status)
    assert verdict.exit_code == DEGRADED
    assert verdict.problems == ("twin 7's uplink is closed for 1m30s; 12 message(s) wait for it",)
    table = render_table(status, verdict, colour=False)
    uplink_table = table[table.index("  uplink") : table.index("  peer ")]
    assert peer_row(uplink_table, 5).split()[:4] == ["5", "this", "site", "open"]
    assert peer_row(uplink_table, 7).split()[:4] == ["7", "the", "twin", "closed"]
    assert peer_row(uplink_table, 7).split()[-1] == "12"
    kept_out = site(redis_view(), daemon_view(uplinks=(UplinkView(5, "out", False, since=NOW - 3),)))
    assert assess(kept_out).problems == (
        "the uplink to twin 5 is closed for 3s: its site cannot reach this one",
    )
    document = json.loads(render_json(status, verdict))
    assert document["uplinks"][1] == {
        "twin": 7,
        "direction": "in",
        "open": False,
        "since": NOW - 90,
        "relay": "",
    }


def test_the_link_to_the_sites_relay_is_listed_and_a_closed_one_is_a_problem() -> None:
    relay = UplinkView(4, "relay", True, since=NOW - 30, relay="relay.example:8051")
    status = site(redis_view(send_queues={4: 3}), daemon_view(uplinks=(relay,)))
    table = render_table(status, assess(status), colour=False)
    row = next(line for line in table.splitlines() if "relay.example" in line)
    cells = row.split()
    assert cells[:7] == ["relay", "relay.example:8051", "(twin", "4)", "this", "site", "open"]
    # What waits for twin 4 is not for its link to the relay: the relay's link has no queue of its own.
    assert cells[-1] == "-"
    never_answered = UplinkView(None, "relay", False, since=NOW - 3, relay="relay.example:8051")
    closed = site(redis_view(), daemon_view(uplinks=(never_answered,)))
    assert assess(closed).problems == (
        "the link to the relay at relay.example:8051 is closed for 3s: other sites cannot reach this one",
    )
    assert "relay relay.example:8051 " in render_table(closed, assess(closed), colour=False)


def test_a_report_without_uplinks_from_an_older_daemon_is_read() -> None:
    report = {
        "twin": 1,
        "version": "0.1.0",
        "started_at": NOW,
        "uptime_s": 1,
        "problems": [],
        "inflight": 0,
        "links_open": 0,
        "peers": [],
        "traffic": TRAFFIC.to_json(),
    }
    assert parse_report(report).uplinks == ()
    with_uplinks = {**report, "uplinks": [{"twin": 5, "direction": "out", "open": True, "since": NOW}]}
    assert parse_report(with_uplinks).uplinks == (UplinkView(5, "out", True, since=NOW),)
