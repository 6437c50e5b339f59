"""Two real sites (redis-server + msgbusd each) talking real HTTP, driven the way existing RMB programs do."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from msgbusd.identity.keys import load_signer
from msgbusd.identity.signing import verify
from testing.local_sites import LocalCluster, SiteProcess, free_port, wait_until
from tests.support.metrics import samples as metric_samples
from tests.support.metrics import scrape
from tests.support.services import RawService, pop_replies, push_request
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls import TlsProxy, make_certificates
from twin_resolver.base import Twin
from wire import keys
from wire.envelope import Envelope, envelope_size_limit

pytestmark = pytest.mark.timeout(60)

FAST_RETRIES = ["--retry-delay", "0.05", "--retry-max-delay", "0.2", "--log-level", "debug"]
PROXY_CLIENT = load_signer("bottom drive obey lake curtain smoke basket hold race lonely fit walk", "sr25519")
PROXY_TWIN = 10
DOWN_TWIN = 3
REFUSING_TWIN = 4
LEGACY_TWIN = 5


class RefusingPeer(ThreadingHTTPServer):
    """A site that answers every POST with HTTP 500, counting them."""

    def __init__(self) -> None:
        self.posts = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                peer.posts += 1
                body = json.dumps({"Status": "error", "Message": "service exploded"}).encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), Handler)


class LegacyPeer(ThreadingHTTPServer):
    """A site that speaks only go-rmb's endpoints: 404 for /zbus-batch; records every envelope POSTed."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.envelopes: list[Envelope] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                peer.paths.append(self.path)
                status, answer = 404, b"404 page not found\n"
                if self.path == "/zbus-remote":
                    peer.envelopes.append(Envelope.decode(body))
                    status, answer = 200, b'{"status": "accepted"}'
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture(scope="module")
def legacy_peer() -> Iterator[LegacyPeer]:
    server = LegacyPeer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def refusing_peer() -> Iterator[RefusingPeer]:
    server = RefusingPeer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def cluster(refusing_peer: RefusingPeer, legacy_peer: LegacyPeer) -> Iterator[LocalCluster]:
    extra = [
        Twin(LEGACY_TWIN, f"127.0.0.1:{legacy_peer.server_address[1]}", bytes([5]) * 32),
        Twin(PROXY_TWIN, "", PROXY_CLIENT.public_key),
        Twin(DOWN_TWIN, f"127.0.0.1:{free_port()}", bytes([3]) * 32),
        Twin(REFUSING_TWIN, f"127.0.0.1:{refusing_peer.server_address[1]}", bytes([4]) * 32),
    ]
    started = LocalCluster(size=2, extra_args=FAST_RETRIES, extra_twins=extra).start()
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture
def site1(cluster: LocalCluster) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(cluster.redis[0].url)
    yield conn
    conn.close()


@pytest.fixture
def site2(cluster: LocalCluster) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(cluster.redis[1].url)
    yield conn
    conn.close()


def backlog_drained(conn: redis.Redis) -> bool:
    return conn.hlen(keys.BACKLOG) == 0 and conn.zcard(keys.OUTBOX) == 0 and conn.zcard(keys.DEADLINES) == 0


def test_round_trip(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "echo.round") as service:
        ret = push_request(site1, [2], "echo.round", b"hello")
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.payload == b"hello"
    assert (reply.src, reply.dst, reply.ret, reply.err) == (2, (1,), ret, "")
    assert reply.uid.startswith("2.")
    (request,) = service.requests
    assert (request.src, request.dst, request.ret) == (1, (2,), keys.REPLY)
    assert request.uid == reply.uid
    wait_until(lambda: backlog_drained(site1), what="site 1 backlog to drain")
    assert site1.ttl(ret) in (-2, keys.RETURN_QUEUE_TTL_S)


def test_return_queue_gets_the_1800s_ttl(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "echo.ttl"):
        ret = push_request(site1, [2, 2], "echo.ttl")
        wait_until(lambda: site1.llen(ret) == 2, what="both replies")
    assert 1790 <= site1.ttl(ret) <= keys.RETURN_QUEUE_TTL_S
    assert site1.ttl(keys.REPLY) == -1 or not site1.exists(keys.REPLY)


def test_several_destinations_get_exactly_one_outcome_each(cluster: LocalCluster, site1: redis.Redis) -> None:
    with (
        RawService(cluster.redis[1].url, "echo.multi", handler=lambda d: b"two:" + d),
        RawService(cluster.redis[0].url, "echo.multi", handler=lambda d: b"one:" + d),
    ):
        ret = push_request(site1, [2, 1, 99], "echo.multi", b"x", retries=1)
        replies = pop_replies(site1, ret, 3)
    by_src = {r.src: r for r in replies}
    assert sorted(by_src) == [1, 2, 99]
    assert by_src[2].payload == b"two:x" and by_src[2].err == ""
    assert by_src[1].payload == b"one:x" and by_src[1].err == ""
    assert by_src[99].err == "all retries done: twin 99 not found"
    wait_until(lambda: backlog_drained(site1), what="backlog to drain")
    assert site1.llen(ret) == 0


def test_a_failing_destination_is_retried_alone(
    cluster: LocalCluster, site1: redis.Redis, refusing_peer: RefusingPeer
) -> None:
    before = refusing_peer.posts
    with RawService(cluster.redis[1].url, "echo.partial") as service:
        ret = push_request(site1, [2, REFUSING_TWIN], "echo.partial", retries=3)
        replies = pop_replies(site1, ret, 2)
    errors = {r.src: r.err for r in replies}
    assert errors[2] == ""
    assert errors[REFUSING_TWIN] == (
        f"all retries done: twin {REFUSING_TWIN} refused the message: 500 service exploded"
    )
    assert refusing_peer.posts - before == 4, "try=3 means 4 attempts"
    assert sum(service.executions.values()) == 1


def test_unknown_twin_fails_after_all_tries(cluster: LocalCluster, site1: redis.Redis) -> None:
    ret = push_request(site1, [99], "echo.unknown", retries=2)
    (error,) = pop_replies(site1, ret, 1)
    assert error.err == "all retries done: twin 99 not found"
    assert error.dat == Envelope(dat="cGluZw==").dat, "the error carries the request's payload"
    log = cluster.sites[0].log()
    assert "retry 1/2" in log and "retry 2/2" in log
    wait_until(lambda: backlog_drained(site1), what="backlog to drain")


def test_log_lines_about_a_message_name_its_uid_command_destination_and_queue(
    cluster: LocalCluster, site1: redis.Redis
) -> None:
    ret = push_request(site1, [98], "echo.logged", retries=1)
    pop_replies(site1, ret, 1)

    def json_lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in cluster.sites[0].log().splitlines() if line.startswith("{")]

    def warnings_about_ret() -> list[dict[str, Any]]:
        return [line for line in json_lines() if line.get("queue") == ret and line["level"] == "WARNING"]

    # The reply is handed over just before the line about it is written.
    wait_until(lambda: bool(warnings_about_ret()), what="the log line about the failure")
    lines = json_lines()
    (final,) = warnings_about_ret()
    assert final["uid"].startswith("98.") and (final["cmd"], final["dst"]) == ("echo.logged", 98)
    assert "failed after 2 attempts: twin 98 not found" in final["msg"]
    retries = [line for line in lines if line.get("uid") == final["uid"] and "retry 1/1" in line["msg"]]
    assert [(line["cmd"], line["dst"]) for line in retries] == [("echo.logged", 98)]


def test_unreachable_site_gives_a_clear_cause(cluster: LocalCluster, site1: redis.Redis) -> None:
    ret = push_request(site1, [DOWN_TWIN], "echo.down", retries=0)
    (error,) = pop_replies(site1, ret, 1)
    assert error.err.startswith(f"all retries done: couldn't reach twin {DOWN_TWIN} at http://127.0.0.1:")


def test_expiry_gives_one_timeout_and_nothing_after(cluster: LocalCluster, site1: redis.Redis) -> None:
    ret = push_request(site1, [2], "nobody.listens", exp=1)
    (error,) = pop_replies(site1, ret, 1)
    assert error.err == "request timeout (expiration reached, 1)"
    assert error.uid.startswith("2.")
    wait_until(lambda: backlog_drained(site1), what="backlog to drain")
    assert site1.llen(ret) == 0


def test_no_stray_timeout_after_a_reply(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "echo.stray"):
        ret = push_request(site1, [2], "echo.stray", exp=1)
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.err == ""
    # Past the request's lifetime the timer has had its chance to (wrongly) send a timeout.
    deadline = time.time() + 1.5
    wait_until(lambda: time.time() > deadline and backlog_drained(site1), what="the lifetime to pass")
    assert site1.llen(ret) == 0


def test_zos_style_client_and_service(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "zos.statistics.get", handler=lambda d: b"{}"):
        ret = push_request(site1, [2], "zos.statistics.get", b"", rpush=True)
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.payload == b"{}"
    assert reply.err == ""


def test_ts_style_service_replying_to_ret(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "ts.echo", reply_to_ret=True):
        ret = push_request(site1, [2], "ts.echo", b"via ret")
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.payload == b"via ret"


def test_rpush_producers_are_served_in_push_order(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "echo.order") as service:
        rets = [push_request(site1, [2], "echo.order", str(i).encode(), rpush=True) for i in range(200)]
        for ret in rets:
            pop_replies(site1, ret, 1)
    assert [r.payload for r in service.requests] == [str(i).encode() for i in range(200)]


def test_invalid_local_requests_get_clear_errors(cluster: LocalCluster, site1: redis.Redis) -> None:
    ret = str(uuid.uuid4())
    site1.lpush(keys.LOCAL, Envelope(ver=2, cmd="x", dst=(2,), ret=ret).encode())
    site1.lpush(keys.LOCAL, Envelope(cmd="", dst=(2,), ret=ret).encode())
    site1.lpush(keys.LOCAL, Envelope(cmd="x", dst=(), ret=ret).encode())
    errors = sorted(r.err for r in pop_replies(site1, ret, 3))
    assert errors == [
        "received invalid message: missing command request",
        "received invalid message: missing twin destination",
        "received invalid message: protocol version mismatch",
    ]


def test_malformed_items_are_dead_lettered_and_the_loop_goes_on(
    cluster: LocalCluster, site1: redis.Redis
) -> None:
    site1.delete(keys.DEAD_LETTER)
    for queue in (keys.LOCAL, keys.REPLY, keys.REMOTE):
        site1.lpush(queue, b"\x00 not json")
    site1.lpush(keys.LOCAL, b'{"src": "5"}')
    with RawService(cluster.redis[1].url, "echo.after.garbage"):
        ret = push_request(site1, [2], "echo.after.garbage")
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.err == ""
    wait_until(lambda: site1.llen(keys.DEAD_LETTER) == 4, what="four dead letters")
    letters = [json.loads(x) for x in site1.lrange(keys.DEAD_LETTER, 0, -1)]
    assert sorted(x["queue"] for x in letters) == sorted([keys.LOCAL, keys.LOCAL, keys.REPLY, keys.REMOTE])
    assert any("field 'src': expected an integer" in x["reason"] for x in letters)
    for queue in keys.SYSTEM_QUEUES:
        assert site1.llen(keys.processing(queue)) == 0


def test_proxy_flow_through_zbus_cmd_and_zbus_result(cluster: LocalCluster) -> None:
    site2 = cluster.sites[1]
    request = PROXY_CLIENT.sign(
        Envelope(cmd="echo.proxy", dat="aGVsbG8=", src=PROXY_TWIN, dst=(2,), now=int(time.time()), pxy=True)
    )
    with (
        RawService(cluster.redis[1].url, "echo.proxy"),
        httpx.Client(base_url=site2.url, trust_env=False) as http,
    ):
        answer = http.post("/zbus-cmd", content=request.encode())
        assert answer.status_code == 200, answer.text
        retqueue = answer.json()["retqueue"]
        body = json.dumps({"retqueue": retqueue})
        results: list[object] = []

        def polled() -> bool:
            results[:] = http.post("/zbus-result", content=body).json()
            return bool(results)

        wait_until(polled, what="the proxy result")
        again = http.post("/zbus-result", content=body).json()
    assert len(results) == 1
    item = Envelope.from_wire(results[0])
    assert item.dat == "hello" and item.err == "" and item.pxy is True
    verify(item, site2.public_key)
    assert [Envelope.from_wire(x).dat for x in again] == ["hello"]


def test_local_proxy_flag_is_cleared_so_the_reply_does_not_loop(
    cluster: LocalCluster, site1: redis.Redis
) -> None:
    ret = str(uuid.uuid4())
    env = Envelope(cmd="echo.localpxy", dst=(2,), ret=ret, dat="eA==", pxy=True, now=int(time.time()))
    with RawService(cluster.redis[1].url, "echo.localpxy") as service:
        site1.lpush(keys.LOCAL, env.encode())
        (reply,) = pop_replies(site1, ret, 1)
    assert reply.err == "" and reply.payload == b"x"
    assert service.requests[0].pxy is False


def probes(site: SiteProcess) -> float:
    return scrape(site.url)['msgbus_messages_total{event="probed"}']


@pytest.mark.slow
def test_peer_down_then_up_delivers_as_soon_as_it_answers() -> None:
    cluster = LocalCluster(size=2, extra_args=["--probe-interval", "0.2"]).start()
    try:
        site1 = redis.Redis.from_url(cluster.redis[0].url)
        cluster.sites[1].stop()
        with RawService(cluster.redis[1].url, "echo.later"):
            ret = push_request(site1, [2], "echo.later", b"later", retries=100)
            wait_until(lambda: "holding messages to twin 2" in cluster.sites[0].log(), what="the peer down")
            wait_until(lambda: probes(cluster.sites[0]) >= 2, what="two probes")
            cluster.sites[1].start()
            # The default retry delay is 5 s: the reply comes from the probe's success, not a re-send.
            (reply,) = pop_replies(site1, ret, 1, timeout_s=4)
        assert reply.payload == b"later" and reply.err == ""
        assert "twin 2 answers again after" in cluster.sites[0].log()
        site1.close()
    finally:
        cluster.cleanup()


@pytest.mark.parametrize("links", [True, False], ids=["links", "posts"])
def test_sites_keep_their_connections_open(links: bool) -> None:
    cluster = LocalCluster(size=2, extra_args=[] if links else ["--no-links"]).prepare()
    proxy = TcpProxy(("127.0.0.1", cluster.sites[1].port))
    cluster.sites[1].advertised_address = f"127.0.0.1:{proxy.port}"
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.keepalive"):
            for _ in range(30):
                ret = push_request(site1, [2], "echo.keepalive")
                assert pop_replies(site1, ret, 1)[0].err == ""
        if links:
            # The first request went alone in a POST (its connection closed once answered); then site 1
            # opened one link, and site 2 answers over it.
            assert proxy.connections == 2
        else:
            # A connection per request (go-rmb) would be 30 or more; a reply may overtake the POST's own
            # answer, so the pool sometimes holds a second connection for a moment.
            assert 0 < proxy.connections <= 5
    finally:
        proxy.close()
        site1.close()
        cluster.cleanup()


@pytest.mark.slow
def test_without_hold_offline_an_absent_peer_fails_fast_and_spends_the_tries() -> None:
    cluster = LocalCluster(size=2, extra_args=["--retry-delay", "0.1", "--retry-max-delay", "0.2"]).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        cluster.sites[1].stop()
        rets = [push_request(site1, [2], "echo.gone", str(i).encode(), retries=2) for i in range(30)]
        errors = [pop_replies(site1, ret, 1)[0].err for ret in rets]
        assert all(e.startswith("all retries done: ") for e in errors), errors
        # Once the circuit is open, messages fail without waiting on the network, naming the last cause.
        assert any("twin 2 is unreachable (couldn't reach twin 2 at" in e for e in errors), errors
        wait_until(lambda: backlog_drained(site1), what="the backlog to drain")
    finally:
        site1.close()
        cluster.cleanup()


@pytest.mark.slow
def test_hold_offline_keeps_messages_for_an_absent_peer_and_delivers_them_in_order() -> None:
    args = ["--retry-delay", "0.1", "--retry-max-delay", "0.3", "--hold-offline"]
    cluster = LocalCluster(size=2, extra_args=args).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        cluster.sites[1].stop()
        # try=0: without --hold-offline each of these would fail at its first attempt.
        rets = [push_request(site1, [2], "echo.held", str(i).encode(), rpush=True) for i in range(50)]
        wait_until(lambda: "holding messages to twin 2" in cluster.sites[0].log(), what="the sender to hold")
        assert all(site1.llen(ret) == 0 for ret in rets)
        with RawService(cluster.redis[1].url, "echo.held") as service:
            cluster.sites[1].start()
            replies = [pop_replies(site1, ret, 1)[0] for ret in rets]
        assert [r.err for r in replies] == [""] * 50
        assert [r.payload for r in service.requests] == [str(i).encode() for i in range(50)]
        assert max(service.executions.values()) == 1
    finally:
        site1.close()
        cluster.cleanup()


@pytest.mark.slow
def test_held_messages_still_expire() -> None:
    cluster = LocalCluster(size=2, extra_args=["--retry-delay", "0.1", "--hold-offline"]).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        cluster.sites[1].stop()
        rets = [push_request(site1, [2], "echo.held.exp", exp=1) for _ in range(5)]
        assert [pop_replies(site1, ret, 1)[0].err for ret in rets] == [
            "request timeout (expiration reached, 1)"
        ] * 5
        wait_until(
            lambda: backlog_drained(site1) and site1.llen(keys.send_queue(2)) == 0, what="a clean backlog"
        )
    finally:
        site1.close()
        cluster.cleanup()


def test_metrics_and_health_are_served_to_this_machine(cluster: LocalCluster, site1: redis.Redis) -> None:
    with RawService(cluster.redis[1].url, "echo.metrics"):
        ret = push_request(site1, [2], "echo.metrics")
        pop_replies(site1, ret, 1)
    with httpx.Client(base_url=cluster.sites[0].url, trust_env=False) as http:
        metrics = http.get("/metrics")
        health = http.get("/healthz")
    assert metrics.status_code == 200
    samples = metric_samples(metrics.text)
    assert samples['msgbus_messages_total{event="accepted"}'] >= 1
    assert samples['msgbus_messages_total{event="delivered_to_caller"}'] >= 1
    assert 'msgbus_queue_length{queue="msgbus.system.local"}' in samples
    # The first batch goes in a POST or, once it is open, over the link.
    sends = [samples.get(f'msgbus_send_seconds_count{{path="{path}"}}', 0) for path in ("remote", "link")]
    assert sum(sends) >= 1
    assert samples["msgbus_round_trip_seconds_count"] >= 1
    assert 0 < samples["msgbus_round_trip_seconds_sum"] < 15 * samples["msgbus_round_trip_seconds_count"]
    assert health.status_code == 200
    assert health.json()["status"] == "ok"


def test_a_peer_without_the_batch_endpoint_gets_one_envelope_per_post_in_order(
    cluster: LocalCluster, site1: redis.Redis, legacy_peer: LegacyPeer
) -> None:
    # Pushed at once, so that the sender has many to send together; exp 1 so they end with a timeout.
    pipe = site1.pipeline()
    rets = []
    for _ in range(30):
        ret = str(uuid.uuid4())
        rets.append(ret)
        env = Envelope(
            cmd="legacy.echo", dst=(LEGACY_TWIN,), ret=ret, dat="eA==", exp=1, now=int(time.time())
        )
        pipe.rpush(keys.LOCAL, env.encode())
    pipe.execute()
    wait_until(lambda: len(legacy_peer.envelopes) == 30, what="30 envelopes at the legacy peer")
    assert set(legacy_peer.paths) <= {"/zbus-batch", "/zbus-remote"}
    assert legacy_peer.paths.count("/zbus-batch") <= 1, "a 404 is remembered"
    counters = [int(env.uid.split(".")[1]) for env in legacy_peer.envelopes]
    assert counters == sorted(counters)
    assert all(env.sig for env in legacy_peer.envelopes)
    for ret in rets:
        assert pop_replies(site1, ret, 1)[0].err == "request timeout (expiration reached, 1)"


def test_a_body_over_the_envelope_of_12_mib_is_refused_before_it_is_read(cluster: LocalCluster) -> None:
    limit = envelope_size_limit(12 * 1024 * 1024)
    with httpx.Client(base_url=cluster.sites[1].url, trust_env=False, timeout=30) as http:
        response = http.post("/zbus-remote", content=b"x" * (limit + 1))
        assert response.status_code == 413
        assert response.json() == {
            "Status": "error",
            "Message": f"message too large: this site takes at most {limit} bytes",
        }
        assert http.get("/healthz").status_code == 200, "the site goes on"


@pytest.mark.slow
def test_batches_are_cut_under_the_size_limit_and_an_oversized_message_gets_a_clear_error() -> None:
    cluster = LocalCluster(size=2, extra_args=["--max-message-size", "200000"]).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.big"):
            # Pushed at once: the sender takes them together, about 1 MB in all, in POSTs of at most 200 kB.
            rets = [push_request(site1, [2], "echo.big", bytes([n]) * 50_000, rpush=True) for n in range(20)]
            replies = [pop_replies(site1, ret, 1)[0] for ret in rets]
            assert [(r.err, r.payload) for r in replies] == [("", bytes([n]) * 50_000) for n in range(20)]
            (too_big,) = pop_replies(site1, push_request(site1, [2], "echo.big", b"z" * 300_000), 1)
        # Refused at once: a peer that finds a message too large always will.
        assert too_big.err == (
            "all retries done: twin 2 refused the message: 413 message too large: this site takes at most "
            f"{envelope_size_limit(200_000)} bytes"
        )
    finally:
        site1.close()
        cluster.cleanup()


def test_a_reply_from_another_twin_than_the_one_asked_is_refused_and_the_real_one_delivered(
    cluster: LocalCluster, site1: redis.Redis
) -> None:
    ret = push_request(site1, [2], "echo.forged", b"real", exp=60)
    wait_until(lambda: any(site1.hscan_iter(keys.BACKLOG)), what="the request to be in the backlog")
    (uid,) = [
        field.decode() for field, entry in site1.hscan_iter(keys.BACKLOG) if Envelope.decode(entry).ret == ret
    ]
    # Twin 10 is a known twin with a valid key, but the request went to twin 2.
    forged = Envelope(
        uid=uid, cmd="echo.forged", dat="Zm9yZ2Vk", src=PROXY_TWIN, dst=(1,), now=int(time.time())
    )
    with httpx.Client(base_url=cluster.sites[0].url, trust_env=False) as http:
        answer = http.post("/zbus-reply", content=PROXY_CLIENT.sign(forged).encode())
        assert answer.status_code == 200, "the envelope itself is authentic"
        wait_until(
            lambda: any(b"not from twin 2" in letter for letter in site1.lrange(keys.DEAD_LETTER, 0, -1)),
            what="the forged reply to be set aside",
        )
        assert site1.llen(ret) == 0, "never delivered"
        assert metric_samples(http.get("/metrics").text)['msgbus_errors_total{cause="forged_reply"}'] == 1
    with RawService(cluster.redis[1].url, "echo.forged"):
        (reply,) = pop_replies(site1, ret, 1)
    assert (reply.src, reply.payload) == (2, b"real")


def test_an_invalid_request_from_the_site_itself_is_answered_once_and_does_not_loop(
    cluster: LocalCluster, site1: redis.Redis
) -> None:
    site = cluster.sites[0]
    own_key = load_signer(site.mnemonic, site.key_type)
    # Signed by site 1 itself, without a command: its error reply goes back to site 1, which has no such
    # request open; nothing may answer that reply again.
    invalid = Envelope(uid="1.424242", cmd="", src=1, dst=(1,), ret=keys.REPLY, now=int(time.time()))
    with httpx.Client(base_url=site.url, trust_env=False) as http:
        assert http.post("/zbus-remote", content=own_key.sign(invalid).encode()).status_code == 200
    wait_until(
        lambda: "dropped reply uid=1.424242: no open request" in site.log(),
        what="the error reply to be dropped",
    )
    dead_letters = site1.llen(keys.DEAD_LETTER)
    wait_until(lambda: all(site1.llen(queue) == 0 for queue in keys.SYSTEM_QUEUES), what="quiet queues")
    assert site.log().count("uid=1.424242") == 2, "refused once, its answer dropped once"
    assert site1.llen(keys.DEAD_LETTER) == dead_letters


@pytest.mark.slow
def test_a_peer_whose_redis_is_away_gets_the_message_again_without_a_try_spent() -> None:
    cluster = LocalCluster(size=2).start()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        cluster.redis[1].stop()
        # try=0: a failed attempt would end the request at once.
        ret = push_request(site1, [2], "echo.busy", b"busy", retries=0)
        wait_until(lambda: "twin 2 cannot take messages now" in cluster.sites[0].log(), what="the peer's 503")
        assert scrape(cluster.sites[1].url)['msgbus_errors_total{cause="redis"}'] >= 1
        cluster.redis[1].start()
        with RawService(cluster.redis[1].url, "echo.busy"):
            (reply,) = pop_replies(site1, ret, 1)
        assert (reply.err, reply.payload) == ("", b"busy")
        assert scrape(cluster.sites[0].url)['msgbus_errors_total{cause="busy"}'] >= 1
    finally:
        site1.close()
        cluster.cleanup()


@pytest.mark.slow
def test_a_site_behind_https_is_reached_with_its_certificate_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, certificate, key = make_certificates(tmp_path)
    cluster = LocalCluster(size=2).prepare()
    proxy = TlsProxy(cluster.sites[1].port, certificate, key)
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        cluster.sites[1].advertised_address = f"https://127.0.0.1:{proxy.port}"
        cluster.launch()
        with RawService(cluster.redis[1].url, "echo.https"):
            # The site does not know the CA that signed the peer's certificate: refused, with the reason.
            (error,) = pop_replies(site1, push_request(site1, [2], "echo.https", retries=0), 1)
            assert error.err.startswith(
                f"all retries done: couldn't reach twin 2 at https://127.0.0.1:{proxy.port}"
            )
            assert "certificate verify failed" in error.err
            monkeypatch.setenv("SSL_CERT_FILE", str(ca))
            cluster.sites[0].stop()
            cluster.sites[0].start()
            (reply,) = pop_replies(site1, push_request(site1, [2], "echo.https", b"over https"), 1)
        assert (reply.err, reply.payload) == ("", b"over https")
    finally:
        site1.close()
        proxy.close()
        cluster.cleanup()
