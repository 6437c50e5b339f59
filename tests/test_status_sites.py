"""``msgbus status`` against real sites: redis-server and msgbusd processes, the command run as a process.

Site 1 sends to twin 3, whose daemon is stopped (its Redis runs on); site 2 calls a service on site 1; site
4's Redis is stopped while its daemon runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from client.status import gather
from testing.local_sites import LocalCluster, wait_until
from tests.support.services import RawService, pop_replies, push_request
from wire import keys

pytestmark = pytest.mark.timeout(90)

MSGBUS = Path(sys.executable).parent / "msgbus"
# Generous: the machine running the tests may be busy.
TIMEOUT = ["--timeout", "10"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    started = LocalCluster(size=4).start()
    try:
        started.sites[2].stop()
        yield started
    finally:
        started.cleanup()


def status_of(cluster: LocalCluster, index: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(MSGBUS), "status", "--redis", cluster.redis[index].url, "--site", cluster.sites[index].url]
    return subprocess.run([*command, *TIMEOUT, *args], capture_output=True, text=True, timeout=60)


def json_status_of(cluster: LocalCluster, index: int) -> tuple[int, dict[str, Any]]:
    done = status_of(cluster, index, "--json")
    assert done.stderr == ""
    return done.returncode, json.loads(done.stdout)


def test_a_healthy_site_after_a_round_trip(cluster: LocalCluster) -> None:
    caller = redis.Redis.from_url(cluster.redis[1].url)
    with RawService(cluster.redis[0].url, "status.echo"):
        for _ in range(3):
            ret = push_request(caller, [1], "status.echo", b"ping", exp=30)
            (reply,) = pop_replies(caller, ret, 1)
            assert reply.err == ""
    caller.close()

    code, report = json_status_of(cluster, 1)

    assert (code, report["status"], report["problems"]) == (0, "healthy", [])
    assert report["daemon"]["reachable"] and report["daemon"]["twin"] == 2
    assert report["daemon"]["version"] and report["daemon"]["uptime_s"] > 0
    assert report["redis"]["reachable"] and report["redis"]["twin"] == 2
    assert [(q["name"], q["waiting"], q["processing"]) for q in report["redis"]["queues"]] == [
        (queue, 0, 0) for queue in keys.SYSTEM_QUEUES
    ]
    assert (report["redis"]["backlog"], report["redis"]["overdue"], report["redis"]["dead_letters"]) == (
        0,
        0,
        0,
    )
    assert report["redis"]["used_memory"] > 0
    (peer,) = report["peers"]
    assert (peer["twin"], peer["state"], peer["queue"], peer["last_error"]) == (1, "up", 0, "")
    assert peer["last_sent_at"] is not None
    traffic = report["traffic"]
    assert traffic["round_trips"] == 3
    assert traffic["round_trip_p50_s"] is not None and traffic["round_trip_p99_s"] is not None
    assert traffic["sent_per_s"] > 0 and traffic["received_per_s"] > 0

    table = status_of(cluster, 1)
    assert table.returncode == 0
    assert "msgbus status: twin 2, msgbusd " in table.stdout and "HEALTHY (exit 0)" in table.stdout
    assert "no problems" in table.stdout
    assert "\033[" not in table.stdout, "no colour when stdout is not a terminal"


def test_a_peer_down_makes_the_site_degraded(cluster: LocalCluster) -> None:
    sender = redis.Redis.from_url(cluster.redis[0].url)
    # Tries to spare and a lifetime to wait in: the request stays queued for twin 3 while it is down.
    push_request(sender, [3], "status.echo", b"ping", exp=120, retries=5)
    sender.close()
    wait_until(
        lambda: any(
            peer.state == "down" for peer in gather(cluster.redis[0].url, cluster.sites[0].url).peers
        ),
        timeout_s=30,
        what="twin 3 to be seen down by site 1",
    )

    code, report = json_status_of(cluster, 0)

    assert (code, report["status"]) == (1, "degraded")
    down = [peer for peer in report["peers"] if peer["twin"] == 3]
    assert len(down) == 1
    (peer,) = down
    assert peer["state"] == "down"
    assert peer["down_since"] is not None and peer["down_since"] <= report["checked_at"]
    assert f"couldn't reach twin 3 at http://{cluster.sites[2].address}" in peer["cause"]
    assert peer["last_error"] and peer["next_probe_in_s"] is not None
    assert peer["queue"] == 1
    assert report["redis"]["send_queues"] == {"3": 1}
    assert any(problem.startswith("twin 3 is down for ") for problem in report["problems"])
    assert any(problem.endswith("1 message(s) wait for it") for problem in report["problems"])

    table = status_of(cluster, 0)
    assert table.returncode == 1
    assert "DEGRADED (exit 1)" in table.stdout
    lines = table.stdout.splitlines()
    (row,) = [line for line in lines if line.split()[:2] == ["3", "down"]]
    *_, queued, last_sent, sender = row.split()
    assert [queued, last_sent] == ["1", "-"], "1 message queued, none sent yet"
    # Sent by the site's one process, named by its instance id (HOST:PID).
    assert sender == report["redis"]["holders"]["3"] and sender.endswith(f":{cluster.sites[0].process.pid}")
    assert "couldn't reach twin 3" in lines[lines.index(row) + 1]


def test_a_site_whose_daemon_is_down_shows_what_its_redis_holds(cluster: LocalCluster) -> None:
    # An app goes on pushing requests while the daemon is down: they wait in Redis.
    app = redis.Redis.from_url(cluster.redis[2].url)
    push_request(app, [1], "status.echo", b"ping", exp=60)
    push_request(app, [1], "status.echo", b"ping", exp=60)
    app.close()

    code, report = json_status_of(cluster, 2)

    assert (code, report["status"]) == (2, "unreachable")
    assert report["daemon"]["reachable"] is False
    assert "Connection refused" in report["daemon"]["error"]
    assert report["problems"][0].startswith("the daemon does not answer")
    assert report["redis"]["reachable"] and report["redis"]["twin"] == 3
    assert report["redis"]["queues"][0] == {"name": keys.LOCAL, "waiting": 2, "processing": 0}
    assert report["traffic"] is None

    table = status_of(cluster, 2)
    assert table.returncode == 2
    assert "msgbus status: twin 3  UNREACHABLE (exit 2)" in table.stdout
    assert f"daemon  {cluster.sites[2].url}  DOES NOT ANSWER" in table.stdout
    (local,) = [line for line in table.stdout.splitlines() if line.split()[:1] == [keys.LOCAL]]
    assert local.split()[1:] == ["2", "0"]


def test_a_site_whose_redis_is_down_is_unreachable(cluster: LocalCluster) -> None:
    cluster.redis[3].stop()

    code, report = json_status_of(cluster, 3)

    assert (code, report["status"]) == (2, "unreachable")
    assert report["redis"]["reachable"] is False and "Connection refused" in report["redis"]["error"]
    assert report["problems"][0].startswith(f"Redis at {cluster.redis[3].url} does not answer")
    # The daemon still answers, and says its Redis is away.
    assert report["daemon"]["reachable"] and report["daemon"]["twin"] == 4
    assert any(problem.startswith("the daemon reports: redis unreachable") for problem in report["problems"])


def test_watch_shows_a_sample_again_and_again_until_interrupted(cluster: LocalCluster) -> None:
    command = [str(MSGBUS), "status", "--redis", cluster.redis[1].url, "--site", cluster.sites[1].url]
    with subprocess.Popen(
        [*command, *TIMEOUT, "--json", "--watch", "0.2"], stdout=subprocess.PIPE, text=True
    ) as watching:
        try:
            assert watching.stdout is not None
            samples = [json.loads(watching.stdout.readline()) for _ in range(2)]
            watching.send_signal(signal.SIGINT)
            assert watching.wait(timeout=30) == samples[-1]["exit_code"]
        finally:
            watching.kill()
    assert samples[0]["checked_at"] < samples[1]["checked_at"]
    assert all(sample["daemon"]["twin"] == 2 for sample in samples)
