"""A thousand edges on one cloud site (``testing.many_edges``: edges that nobody can dial, each keeping an
uplink with msgbusd's own link code): every edge reached by the cloud and reaching it, and after a restart of
the cloud every edge back, spread over seconds rather than all at once, with nothing lost or run twice; on a
cloud site of two processes, the edges of one killed land on the other, and what waited for them flows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import redis

from msgbusd.link.uplinks import UPLINK_WAIT_S
from testing.local_sites import LocalCluster, SiteProcess, wait_until
from testing.many_edges import ManyEdgesProcess
from tests.support.services import RawService, pop_replies, push_request
from wire import keys

pytestmark = pytest.mark.timeout(300)

EDGES = 1000
CLOUD = 1


@pytest.fixture
def cloud_and_edges(tmp_path: Path) -> Iterator[tuple[LocalCluster, ManyEdgesProcess]]:
    edges = ManyEdgesProcess(cloud=CLOUD, count=EDGES, log_path=tmp_path / "edges.log")
    cluster = LocalCluster(size=1, extra_twins=edges.twins()).start()
    try:
        edges.start(cluster.twins_file)
        yield cluster, edges
    finally:
        edges.stop()
        cluster.cleanup()


def all_open(edges: ManyEdgesProcess, timeout_s: float = 120.0) -> dict[str, object]:
    return edges.wait_for(lambda stats: stats["open"] == EDGES, timeout_s, f"all {EDGES} uplinks to be open")


def ask_every_edge(conn: redis.Redis, edges: ManyEdgesProcess, what: str) -> dict[int, str]:
    """One request to each edge; its return queue by edge."""
    return {
        edge: push_request(conn, [edge], "edge.echo", f"{what} {edge}".encode(), exp=300, retries=3)
        for edge in edges.ids
    }


def answered_once(conn: redis.Redis, rets: dict[int, str], what: str, within_s: float = 120.0) -> None:
    """Each request of ``rets`` answered, all within ``within_s``, and none twice."""
    deadline = time.monotonic() + within_s
    for edge, ret in rets.items():
        (reply,) = pop_replies(conn, ret, 1, timeout_s=max(0.0, deadline - time.monotonic()))
        assert (reply.err, reply.payload) == ("", f"{what} {edge}".encode()), f"edge {edge}"
    assert not any(conn.llen(ret) for ret in rets.values()), "a request answered twice"


def test_every_edge_is_reached_and_reaches_the_cloud_and_all_come_back_spread_after_a_restart(
    cloud_and_edges: tuple[LocalCluster, ManyEdgesProcess],
) -> None:
    cluster, edges = cloud_and_edges
    cloud = cluster.sites[0]
    first = all_open(edges)
    assert first["upgrades"] >= EDGES
    conn = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[0].url, "cloud.echo") as service:
            answered_once(conn, ask_every_edge(conn, edges, "before"), "before")
            edges.send("cloud.echo")
            stats = edges.wait_for(lambda stats: stats["replies"] == EDGES, 120, "every edge's reply")
            assert stats["requests_refused"] == 0
            assert sorted(int(key.split("/")[0]) for key in service.executions) == list(edges.ids)
            assert set(service.executions.values()) == {1}, "a request of an edge run twice"

            cloud.stop()
            # What waits for the edges while the cloud is down is theirs once they are back.
            waiting = ask_every_edge(conn, edges, "waiting")
            restarted_at = time.time()
            cloud.start()
            back_at = time.time()
            all_open(edges)
            answered_once(conn, waiting, "waiting")
            assert conn.hlen(keys.BACKLOG) == 0
    finally:
        conn.close()
    seen = edges.stats(opened=True)
    opened, dialed = seen["opened_at"], [at for at in seen["dialed_at"] if at >= back_at]
    assert len(opened) == EDGES and min(opened) >= restarted_at
    in_the_first_second = sum(1 for at in opened if at < min(opened) + 1.0)
    busiest = max(sum(1 for at in dialed if start <= at < start + 0.1) for start in dialed)
    print(
        f"{EDGES} edges back over {max(opened) - min(opened):.1f} s after the cloud started again "
        f"({in_the_first_second} in the first second), {len(dialed)} dials since, at most {busiest} in "
        f"100 ms; {seen['dials']} dials in all"
    )
    # The edges dial again over their backoff (with full jitter), not all at once.
    assert in_the_first_second < 0.8 * EDGES, f"{in_the_first_second} of {EDGES} back in the first second"


def uplinks_in_log(site: SiteProcess) -> dict[int, float]:
    """When each edge's uplink last opened to this process (unix time), from its log."""
    opened: dict[int, float] = {}
    for raw in site.log().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if str(line.get("msg", "")).endswith("opened its uplink to this site"):
            opened[int(line["twin"])] = datetime.fromisoformat(line["ts"]).timestamp()
    return opened


def test_on_a_site_of_two_processes_the_edges_of_one_killed_land_on_the_other_and_what_waited_flows(
    tmp_path: Path,
) -> None:
    edges = ManyEdgesProcess(cloud=CLOUD, count=EDGES, log_path=tmp_path / "edges.log")
    cluster = LocalCluster(size=1, processes=2, extra_twins=edges.twins()).start()
    conn = redis.Redis.from_url(cluster.redis[0].url)
    try:
        edges.start(cluster.twins_file)
        all_open(edges)
        kept, killed = cluster.processes_of(CLOUD)
        # Each process logs the uplinks it took (its log is written by a thread of its own, a moment later).
        wait_until(
            lambda: set(uplinks_in_log(kept)) | set(uplinks_in_log(killed)) == set(edges.ids),
            30,
            "every uplink in the processes' logs",
        )
        on_kept, on_killed = uplinks_in_log(kept), uplinks_in_log(killed)
        # The kernel spreads the edges' connections over both processes.
        assert min(len(on_kept), len(on_killed)) > EDGES // 5, (len(on_kept), len(on_killed))
        # Whichever process takes a request, it reaches the edge over the process its uplink is open to, and
        # without waiting for the sender that took it for its own to look again (UPLINK_WAIT_S).
        answered_once(conn, ask_every_edge(conn, edges, "spread"), "spread", within_s=UPLINK_WAIT_S / 2)

        # An edge whose uplink moved to the other process before the kill is not the killed one's.
        held = {edge for edge, at in on_killed.items() if at > on_kept.get(edge, 0.0)}
        killed.kill()
        killed_at = time.time()
        waiting = ask_every_edge(conn, edges, "waiting")

        def all_back_on_the_other() -> bool:
            opened = uplinks_in_log(kept)
            return all(opened.get(edge, 0.0) > on_killed[edge] for edge in held)

        wait_until(all_back_on_the_other, 120, "the edges of the killed process back on the other")
        all_open(edges)
        answered_once(conn, waiting, "waiting")
        print(
            f"{len(held)} of {EDGES} edges on the killed process; all back on the other "
            f"{max(edges.stats(opened=True)['opened_at']) - killed_at:.1f} s after the kill"
        )
    finally:
        conn.close()
        edges.stop()
        cluster.cleanup()
