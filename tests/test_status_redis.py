"""``msgbus status`` reading a real Redis (the shared one) with no daemon beside it, and a daemon address
that answers something other than a status report."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
from typer.testing import CliRunner

from client.cli import app
from client.status import DaemonUnavailable, gather, read_daemon
from client.status_check import UNREACHABLE, assess
from testing.local_sites import free_port
from wire import keys

runner = CliRunner()


def letter(reason: str, at: float, queue: str = keys.LOCAL) -> str:
    return json.dumps({"queue": queue, "reason": reason, "raw": "x", "at": at})


def test_what_redis_holds_is_read_in_full_while_the_daemon_is_away(
    sync_redis: redis.Redis, redis_url: str
) -> None:
    now = time.time()
    sync_redis.set(keys.SITE_TWIN, 4)
    sync_redis.rpush(keys.LOCAL, b"a", b"b")
    sync_redis.rpush(keys.processing(keys.REMOTE), b"c")
    sync_redis.hset(keys.BACKLOG, mapping={"2.1": "r", "2.2": "r", "3.1": "r"})
    sync_redis.hset(keys.REPLIES, "2|2.7", "reply")
    sync_redis.zadd(keys.OUTBOX, {"req:2.2": now + 30})
    # One request long past its deadline, one only just: the expiry timer has a moment to answer it.
    sync_redis.zadd(keys.DEADLINES, {"2.1": now - 60, "2.2": now - 1, "3.1": now + 300})
    sync_redis.lpush(keys.DEAD_LETTER, letter("old", now - 3600), b"{not json", letter("newest", now - 10))
    sync_redis.sadd(keys.DESTINATIONS, 2, 3)
    sync_redis.rpush(keys.send_queue(2), "req:2.1", "req:2.2")
    site_url = f"http://127.0.0.1:{free_port()}"

    status = gather(redis_url, site_url, timeout_s=2)

    view = status.redis
    assert view is not None and status.redis_error == ""
    assert view.twin == 4
    assert [(q.name, q.waiting, q.processing) for q in view.queues] == [
        (keys.LOCAL, 2, 0),
        (keys.REMOTE, 0, 1),
        (keys.REPLY, 0, 0),
    ]
    assert (view.backlog, view.replies, view.retries_scheduled, view.overdue) == (3, 1, 1, 1)
    assert view.dead_letters == 3
    assert [letter.reason for letter in view.newest_dead_letters] == [
        "newest",
        "an unreadable dead letter: b'{not json'",
        "old",
    ]
    assert view.send_queues == {2: 2, 3: 0}
    assert view.used_memory > 0 and view.used_memory_human
    assert status.daemon is None and site_url in status.daemon_error
    assert [(peer.twin, peer.state, peer.queue) for peer in status.peers] == [
        (2, "unknown", 2),
        (3, "unknown", 0),
    ]
    verdict = assess(status)
    assert verdict.exit_code == UNREACHABLE
    assert verdict.problems[0].startswith("the daemon does not answer")
    assert any("1 request(s) more than 5s past their deadline" in problem for problem in verdict.problems)
    assert any("dead-lettered 10s ago" in problem for problem in verdict.problems)


def test_a_redis_that_does_not_answer_is_reported_at_once() -> None:
    status = gather(f"redis://127.0.0.1:{free_port()}/0", f"http://127.0.0.1:{free_port()}", timeout_s=2)
    assert status.redis is None and "Connection refused" in status.redis_error
    assert status.peers == ()
    assert assess(status).exit_code == UNREACHABLE


class Answering(ThreadingHTTPServer):
    """Answers every GET with a fixed status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def answering(request: pytest.FixtureRequest) -> Iterator[str]:
    status, body = request.param
    server = Answering(status, body)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("answering", "error"),
    [
        (
            (403, b'{"Status":"error","Message":"only served to clients on this machine"}'),
            "answered 403: only served to clients on this machine",
        ),
        ((200, b"<html>a web server</html>"), "answered no status report"),
        ((200, b'{"twin": 1}'), "answered no status report"),
    ],
    indirect=["answering"],
)
def test_a_site_that_answers_no_status_report_is_told_apart_from_a_dead_one(
    answering: str, error: str
) -> None:
    with pytest.raises(DaemonUnavailable) as caught:
        read_daemon(answering, timeout_s=2)
    assert caught.value.answered
    assert error in str(caught.value)


def test_bad_urls_are_usage_errors() -> None:
    result = runner.invoke(app, ["status", "--redis", "nope://x"])
    assert result.exit_code == 2
    assert "invalid Redis URL 'nope://x'" in result.output
    result = runner.invoke(app, ["status", "--site", "127.0.0.1:8051"])
    assert result.exit_code == 2
    assert "--site: '127.0.0.1:8051' is not an http:// or https:// URL" in result.output


def test_the_site_processes_are_listed_with_what_they_hold(sync_redis: redis.Redis, redis_url: str) -> None:
    now = float(sync_redis.time()[0])
    sync_redis.zadd(keys.INSTANCES, {"edge:11": now - 0.5, "edge:12": now - 30})
    sync_redis.hset(keys.instance_info("edge:11"), mapping={"owned": 3, "lease": 5, "sent_per_s": 12.5})
    sync_redis.hset(keys.instance_info("edge:12"), mapping={"owned": 1, "lease": 5})
    sync_redis.hset(keys.OWNERS, mapping={"2": "edge:11", keys.LOCAL_LEASE: "edge:11", "3": "edge:12"})
    sync_redis.rpush(keys.instance_processing(keys.LOCAL, "edge:12"), b"x")
    sync_redis.sadd(keys.DESTINATIONS, 2)
    sync_redis.rpush(keys.send_queue(2), "req:2.1")

    status = gather(redis_url, f"http://127.0.0.1:{free_port()}", timeout_s=2)

    view = status.redis
    assert view is not None
    live, dead = view.instances
    assert (live.id, live.alive, live.leases, live.sent_per_s) == ("edge:11", True, 3, 12.5)
    assert (dead.id, dead.alive) == ("edge:12", False) and dead.last_beat_s_ago >= 29
    # What a process holds in its processing list counts as being processed.
    assert view.queues[0].processing == 1
    assert [(peer.twin, peer.sender) for peer in status.peers] == [(2, "edge:11")]
    assert any("msgbusd process edge:12 has not beaten for" in problem for problem in assess(status).problems)
    table = runner.invoke(
        app, ["status", "--redis", redis_url, "--site", "http://127.0.0.1:1", "--timeout", "2"]
    )
    (row,) = [line for line in table.stdout.splitlines() if line.startswith("  edge:11")]
    assert row.split()[1:2] == ["alive"] and row.split()[-1] == "local"
