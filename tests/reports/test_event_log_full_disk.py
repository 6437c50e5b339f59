"""A site whose event log cannot be written carries every message: it drops the events, counts them in
``/metrics``, says so in its log and in ``/status``, and writes again once it can. Real sites: site 1's event
log on a small tmpfs of its own that the test fills (root only), and a site started with a file where its
event log directory should be."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from client.status import gather
from client.status_check import DEGRADED, assess
from testing.local_sites import LocalCluster, SiteProcess, wait_until
from testing.site_metrics import metric
from tests.reports.event_log_disk import fill, small_disk
from tests.support.services import RawService, pop_replies, push_request
from wire import event_schema as ev

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

DROPPED = "msgbus_event_log_dropped_total"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", 512) as mounted:
        yield mounted


def start_sites(site1_args: list[str]) -> LocalCluster:
    """Two sites; site 1 runs with ``site1_args`` besides the usual ones."""
    cluster = LocalCluster(size=2).prepare()
    first = cluster.sites[0]
    first.extra_args = [*first.extra_args, *site1_args]
    return cluster.launch()


@pytest.fixture
def full_disk_sites(disk: Path) -> Iterator[LocalCluster]:
    # Files are completed each second, so that a new one shows soon once writing resumes.
    cluster = start_sites(["--event-log", str(disk / "events"), "--event-log-rotate-seconds", "1"])
    try:
        yield cluster
    finally:
        cluster.cleanup()


def event_log_warnings(site: SiteProcess, redis_url: str) -> list[str]:
    """The event log's warnings in ``/status``, as ``msgbus status`` gets them."""
    status = gather(redis_url, site.url, timeout_s=10)
    assert status.daemon is not None, status.daemon_error
    return [warning for warning in status.daemon.warnings if warning.startswith("the event log in ")]


def completed_events(directory: Path) -> dict[str, list[dict[str, object]]]:
    """The events of each completed file, by its name, each file checked to hold whole lines only."""
    found = {}
    for path in sorted(directory.glob("events-*.jsonl")):
        text = path.read_text()
        assert text == "" or text.endswith("\n"), f"{path.name} ends in the middle of a line"
        found[path.name] = [json.loads(line) for line in text.splitlines()]
    return found


def delivered(events: list[dict[str, object]]) -> set[str]:
    return {str(event["uid"]) for event in events if event["event"] == ev.DELIVERED}


def test_a_full_disk_drops_events_says_so_and_writing_resumes_while_every_request_is_answered(
    full_disk_sites: LocalCluster, disk: Path
) -> None:
    site1, events, redis1 = full_disk_sites.sites[0], disk / "events", full_disk_sites.redis[0].url
    caller = redis.Redis.from_url(redis1)
    answered = 0

    def round_trips(count: int, phase: bytes) -> set[str]:
        nonlocal answered
        uids = set()
        for _ in range(count):
            (reply,) = pop_replies(caller, push_request(caller, [2], "echo.disk", phase, exp=60), 1)
            assert (reply.err, reply.payload) == ("", phase)
            answered += 1
            uids.add(reply.uid)
        return uids

    def dropped() -> float:
        return metric(site1, DROPPED, reason="no_space") or 0.0

    try:
        with RawService(full_disk_sites.redis[1].url, "echo.disk"):
            before = round_trips(5, b"before")
            wait_until(
                lambda: before <= {uid for e in completed_events(events).values() for uid in delivered(e)},
                timeout_s=30,
                what="the first round trips in a completed file",
            )
            assert event_log_warnings(site1, redis1) == []

            filler = fill(disk)
            # More events than the last page of the file being written can take.
            round_trips(20, b"full")
            wait_until(lambda: dropped() > 0, timeout_s=30, what="events dropped for want of space")
            round_trips(5, b"still full")
            [warning] = event_log_warnings(site1, redis1)
            assert warning.startswith(
                f"the event log in {events} cannot be written (No space left on device): "
            )
            assert warning.endswith("; messages are carried as usual; it writes again once it can")
            verdict = assess(gather(redis1, site1.url, timeout_s=10))
            assert verdict.exit_code == DEGRADED and warning in verdict.problems
            wait_until(
                lambda: (
                    f"the event log in {events} cannot be written (No space left on device): " in site1.log()
                ),
                timeout_s=30,
                what="the daemon's warning",
            )
            dropped_while_full = dropped()

            filler.unlink()
            known = set(completed_events(events))
            after = round_trips(5, b"after")
            wait_until(
                lambda: (
                    after
                    <= set().union(
                        *(
                            delivered(lines)
                            for name, lines in completed_events(events).items()
                            if name not in known
                        )
                    )
                ),
                timeout_s=30,
                what="the round trips after the disk was freed in a new file",
            )
            wait_until(
                lambda: event_log_warnings(site1, redis1) == [], timeout_s=30, what="the warning to go"
            )
            assert dropped() >= dropped_while_full > 0, "the count stays"
    finally:
        caller.close()
    assert answered == 5 + 20 + 5 + 5
    assert site1.stop() == 0, "a graceful stop, as ever"
    completed_events(events)
    assert list(events.glob("*.writing")) == []


def test_a_site_starts_when_its_event_log_directory_cannot_be_made(tmp_path: Path) -> None:
    taken = tmp_path / "events"
    taken.write_text("a file where the directory should be\n")
    cluster = start_sites(["--event-log", str(taken)])
    caller = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.nodir"):
            for _ in range(3):
                (reply,) = pop_replies(caller, push_request(caller, [2], "echo.nodir", b"x", exp=60), 1)
                assert reply.err == ""
        site1 = cluster.sites[0]
        wait_until(
            lambda: (metric(site1, DROPPED, reason="not_a_directory") or 0) > 0,
            timeout_s=30,
            what="drops counted",
        )
        [warning] = event_log_warnings(site1, cluster.redis[0].url)
        assert warning.startswith(f"the event log in {taken} cannot be written (Not a directory): ")
        assert f"the event log in {taken} cannot be written (Not a directory)" in site1.log()
    finally:
        caller.close()
        cluster.cleanup()
