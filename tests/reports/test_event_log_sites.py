"""Event logs written by two real sites, and the backlog snapshot of a site, as the Spark job reads them."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from client.cli import app
from testing.local_sites import LocalCluster, wait_until
from tests.support.services import RawService, pop_replies, push_request
from wire import event_schema as ev
from wire import keys

runner = CliRunner()


@pytest.fixture
def logged_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    args = ["--retry-delay", "0.05", "--retry-max-delay", "0.2", "--event-log", str(tmp_path / "events")]
    cluster = LocalCluster(size=2, extra_args=args).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def events_by_request(directory: Path) -> dict[tuple[int, str], list[dict[str, object]]]:
    by_request: dict[tuple[int, str], list[dict[str, object]]] = defaultdict(list)
    for path in sorted(directory.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            assert set(event) <= set(ev.EVENT_FIELDS), event
            assert event["event"] in ev.EVENTS
            if event.get("uid"):
                by_request[(int(event["src"]), str(event["uid"]))].append(event)
    return by_request


def test_both_sites_log_every_step_of_a_round_trip_and_of_a_failure(
    logged_cluster: LocalCluster, tmp_path: Path
) -> None:
    site1 = redis.Redis.from_url(logged_cluster.redis[0].url)
    try:
        with RawService(logged_cluster.redis[1].url, "echo.logged"):
            ret = push_request(site1, [2], "echo.logged", b"hello")
            (reply,) = pop_replies(site1, ret, 1)
        failed_ret = push_request(site1, [97], "echo.nowhere", retries=1)
        (failure,) = pop_replies(site1, failed_ret, 1)
    finally:
        site1.close()
    for site in logged_cluster.sites:
        assert site.stop() == 0
    by_request = events_by_request(tmp_path / "events")

    steps = sorted(by_request[(1, reply.uid)], key=lambda e: (int(str(e["ts"])), str(e["event"])))
    assert [(e["site"], e["event"]) for e in steps] == [
        (1, "accepted"),
        (1, "sent"),
        (2, "received"),
        (2, "handed_to_service"),
        (2, "reply_taken"),
        (2, "reply_sent"),
        (1, "reply_received"),
        (1, "delivered"),
    ]
    assert all((e["src"], e["dst"]) == (1, 2) for e in steps), "src and dst name the request's direction"
    first = steps[0]
    assert (first["cmd"], first["ret"], first["bytes"]) == ("echo.logged", ret, 5)
    sent = steps[1]
    assert sent["attempt"] == 1 and sent["status"] == 200 and int(str(sent["duration_us"])) > 0
    assert steps[3]["queue"] == "msgbus.echo.logged"

    (failed_uid,) = [uid for src, uid in by_request if uid.startswith("97.")]
    failed_steps = [e["event"] for e in by_request[(1, failed_uid)]]
    assert failed_steps == ["accepted", "send_failed", "retry_scheduled", "send_failed", "failed"]
    final = by_request[(1, failed_uid)][-1]
    assert final["error"] == failure.err == "all retries done: twin 97 not found"


def test_backlog_dump_lists_pending_requests_with_ages_and_deadlines(logged_cluster: LocalCluster) -> None:
    site1 = redis.Redis.from_url(logged_cluster.redis[0].url)
    try:
        ret = push_request(site1, [2], "nobody.serves", exp=300)
        deadline_wanted = time.time() + 300
        wait_until(lambda: site1.hlen(keys.BACKLOG) == 1, what="the request to be accepted")
        site1.lpush(keys.REPLY, b"not an envelope")
        result = runner.invoke(app, ["backlog", "dump", "--redis", logged_cluster.redis[0].url])
    finally:
        site1.close()
    assert result.exit_code == 0, result.output
    entries = [json.loads(line) for line in result.stdout.splitlines()]
    (request,) = [e for e in entries if e["kind"] == "request"]
    assert set(request) <= set(ev.BACKLOG_FIELDS)
    assert request["uid"].startswith("2.") and request["cmd"] == "nobody.serves"
    assert (request["site"], request["src"], request["dst"], request["ret"]) == (1, 1, 2, ret)
    assert 0 <= request["age_s"] < 60
    assert abs(request["deadline"] / 1e6 - deadline_wanted) < 5
    assert request["attempt"] == 0
    assert any(e["kind"] in ("queued", "dead_letter") for e in entries), "the bad item is listed"


def completed_lines(directory: Path) -> list[dict[str, object]]:
    """Every line of the completed files, each checked to be whole."""
    lines = []
    for path in sorted(directory.glob("events-*.jsonl")):
        text = path.read_text()
        assert text.endswith("\n"), f"{path.name} ends in the middle of a line"
        lines += [json.loads(line) for line in text.splitlines()]
    return lines


def writing_an_acceptance(directory: Path, site: int) -> bool:
    """Whether the file ``site`` is writing holds a request's acceptance, written whole."""
    for path in directory.glob(f"events-{site}-*.writing"):
        with suppress(FileNotFoundError):
            lines = path.read_bytes().split(b"\n")[:-1]
            if any(json.loads(line)["event"] == ev.ACCEPTED for line in lines):
                return True
    return False


def test_a_site_names_its_files_as_they_complete_and_after_a_kill_its_restart_completes_the_last(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events"
    args = ["--event-log", str(events), "--event-log-rotate-seconds", "1"]
    cluster = LocalCluster(size=2, extra_args=args).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.logged"):

            def round_trip() -> None:
                pop_replies(site1, push_request(site1, [2], "echo.logged", b"hello"), 1)

            round_trip()
            # The first file is named once it is a second old, while the site runs.
            wait_until(lambda: bool(list(events.glob("events-1-*.jsonl"))), what="a completed file of site 1")
            assert next(e["event"] for e in completed_lines(events) if e["site"] == 1) == ev.ACCEPTED
            round_trip()
            # Killed once the second request's acceptance is in the file it writes (one just opened is empty).
            wait_until(lambda: writing_an_acceptance(events, 1), what="site 1 writing the second request")
            cluster.sites[0].kill()
            [left] = events.glob("events-1-*.writing")
            cluster.sites[0].start()
            assert not left.exists()
            assert left.with_name(left.name.removesuffix(".writing")).exists()
            assert "completed the event log file" in cluster.sites[0].log()
            # Both round trips' events were written before the kill, the second's in the file it left.
            accepted = [e for e in completed_lines(events) if e["site"] == 1 and e["event"] == ev.ACCEPTED]
            assert len(accepted) == 2
    finally:
        site1.close()
        cluster.cleanup()
