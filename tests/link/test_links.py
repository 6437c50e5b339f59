"""Links between real sites: a site's requests go over the WebSocket it opened and their replies come back on
it; a peer that refuses the upgrade gets POSTs; a site whose key does not match is refused; a cut link loses
nothing."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from msgbusd.identity.keys import load_signer, new_mnemonic
from testing.local_sites import LocalCluster, wait_until
from tests.support.metrics import scrape
from tests.support.services import RawService, pop_replies, push_request
from tests.support.tcp_proxy import TcpProxy
from twin_resolver.base import Twin
from twin_resolver.static import write_twin_file

pytestmark = pytest.mark.timeout(90)

FAST_RETRIES = ["--retry-delay", "0.05", "--retry-max-delay", "0.2"]
# A link from a twin's first message on (by default a single message goes in a POST).
LINK_AT_ONCE = ["--link-after", "1"]


def round_trip(conn: redis.Redis, dst: int, cmd: str, data: bytes = b"ping") -> bytes:
    (reply,) = pop_replies(conn, push_request(conn, [dst], cmd, data), 1)
    assert reply.err == ""
    return reply.payload


def test_requests_go_over_the_senders_link_and_replies_come_back_on_it() -> None:
    cluster = LocalCluster(size=2).prepare()
    proxies = {site.twin: TcpProxy(("127.0.0.1", site.port)) for site in cluster.sites}
    for site in cluster.sites:
        site.advertised_address = f"127.0.0.1:{proxies[site.twin].port}"
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    site2 = redis.Redis.from_url(cluster.redis[1].url)
    try:
        with (
            RawService(cluster.redis[0].url, "echo.one", handler=lambda data: b"1:" + data),
            RawService(cluster.redis[1].url, "echo.two", handler=lambda data: b"2:" + data),
        ):
            # A twin's first message goes in a POST (and its reply too): no link for a single message.
            assert round_trip(site1, 2, "echo.two", b"first") == b"2:first"
            for site in cluster.sites:
                assert scrape(site.url)["msgbus_links_open"] == 0
            for n in range(10):
                assert round_trip(site1, 2, "echo.two", b"%d" % n) == b"2:%d" % n
            # Site 1 kept sending: one link, which carried site 2's replies back.
            assert scrape(cluster.sites[1].url)['msgbus_send_seconds_count{path="link"}'] == 10
            # Site 2's own requests go to the address the resolver gives for twin 1, on a link of its own.
            for n in range(10):
                assert round_trip(site2, 1, "echo.one", b"%d" % n) == b"1:%d" % n
                assert round_trip(site1, 2, "echo.two", b"%d" % n) == b"2:%d" % n
        # Two connections each way: the first message's POST (its connection closed once answered: a lone
        # message keeps none), then the link, which carried everything after.
        assert (proxies[1].connections, proxies[2].connections) == (2, 2)
        for site in cluster.sites:
            metrics = scrape(site.url)
            assert metrics["msgbus_links_open"] == 2
            assert metrics['msgbus_send_seconds_count{path="link"}'] == 30
        posts = [scrape(site.url) for site in cluster.sites]
        assert posts[0]['msgbus_send_seconds_count{path="remote"}'] == 1
        assert posts[1]['msgbus_send_seconds_count{path="reply"}'] == 1
    finally:
        for proxy in proxies.values():
            proxy.close()
        site1.close()
        site2.close()
        cluster.cleanup()


def test_a_peer_that_refuses_the_upgrade_is_sent_posts() -> None:
    cluster = LocalCluster(size=2).prepare()
    cluster.sites[1].extra_args = ["--no-links"]
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    site2 = redis.Redis.from_url(cluster.redis[1].url)
    try:
        with (
            RawService(cluster.redis[0].url, "echo.one"),
            RawService(cluster.redis[1].url, "echo.two"),
        ):
            for n in range(5):
                assert round_trip(site1, 2, "echo.two", b"%d" % n) == b"%d" % n
                assert round_trip(site2, 1, "echo.one", b"%d" % n) == b"%d" % n
        assert "twin 2 takes POSTs only (the upgrade was answered 404)" in cluster.sites[0].log()
        for site in cluster.sites:
            metrics = scrape(site.url)
            assert metrics["msgbus_links_open"] == 0
            assert metrics['msgbus_send_seconds_count{path="link"}'] == 0
            assert metrics['msgbus_send_seconds_count{path="remote"}'] >= 5
    finally:
        site1.close()
        site2.close()
        cluster.cleanup()


def test_a_site_whose_key_does_not_match_the_resolver_gets_no_link_either_way() -> None:
    cluster = LocalCluster(size=2, extra_args=[*FAST_RETRIES, *LINK_AT_ONCE]).prepare()
    site1, site2 = cluster.sites
    # The resolver says twin 2 holds another key than the one its site signs with.
    impostor_key = load_signer(new_mnemonic(), "sr25519").public_key
    write_twin_file(
        cluster.twins_file,
        [
            Twin(id=1, address=site1.address, public_key=site1.public_key),
            Twin(id=2, address=site2.address, public_key=impostor_key),
        ],
    )
    for site in cluster.sites:
        site.start()
    conn1 = redis.Redis.from_url(cluster.redis[0].url)
    conn2 = redis.Redis.from_url(cluster.redis[1].url)
    try:
        with RawService(cluster.redis[1].url, "echo.two"), RawService(cluster.redis[0].url, "echo.one"):
            (to_2,) = pop_replies(conn1, push_request(conn1, [2], "echo.two"), 1)
            (to_1,) = pop_replies(conn2, push_request(conn2, [1], "echo.one"), 1)
        # Site 1 opened a link and the site there failed to prove it is twin 2.
        assert to_2.err.startswith(f"all retries done: twin 2 at {site2_url(site2.address)} refused a link:")
        assert "the site there is not twin 2: couldn't verify signature" in to_2.err
        # Site 2 opened a link to site 1, which refused it: its hello is not signed with twin 2's key.
        assert to_1.err.startswith(f"all retries done: twin 1 at {site2_url(site1.address)} refused a link:")
        assert "4403" in to_1.err and "not signed by twin 2: couldn't verify signature" in to_1.err
        assert "refused a link: not signed by twin 2" in site1.log()
        for site in cluster.sites:
            assert scrape(site.url)["msgbus_links_open"] == 0
    finally:
        conn1.close()
        conn2.close()
        cluster.cleanup()


def site2_url(address: str) -> str:
    return f"http://{address}/zbus-link"


@pytest.mark.slow
def test_a_12_mib_payload_crosses_a_link() -> None:
    cluster = LocalCluster(size=2, extra_args=LINK_AT_ONCE).start()
    conn = redis.Redis.from_url(cluster.redis[0].url)
    payload = bytes(range(256)) * (12 * 1024 * 1024 // 256)
    try:
        with RawService(cluster.redis[1].url, "echo.big"):
            (reply,) = pop_replies(conn, push_request(conn, [2], "echo.big", payload, exp=60), 1, 60)
        assert reply.err == ""
        assert reply.payload == payload
        metrics = scrape(cluster.sites[0].url)
        assert metrics["msgbus_links_open"] == 1
        assert metrics['msgbus_send_seconds_count{path="link"}'] == 1
    finally:
        conn.close()
        cluster.cleanup()


# What site 1 logs when its links to twin 2 keep breaking.
FALLBACK = "sending it POSTs for"
# Each cut costs the messages on their way a try (two when it also fails the link opened after it); on a
# slow machine the links take long to give way to POSTs, and a message may meet many cuts. What this test
# judges is that nothing is lost or run twice, not how many tries a request may have.
CUT_TRIES = 1000


@pytest.mark.slow
def test_links_cut_mid_frame_lose_nothing_and_run_nothing_twice() -> None:
    cluster = LocalCluster(size=2, extra_args=[*FAST_RETRIES, "--send-timeout", "3"]).prepare()
    # Both ways go through proxies: after a cut, either site may open the next link.
    proxies = [TcpProxy(("127.0.0.1", site.port)) for site in cluster.sites]
    for site, proxy in zip(cluster.sites, proxies, strict=True):
        site.advertised_address = f"127.0.0.1:{proxy.port}"
    cluster.launch()
    conn = redis.Redis.from_url(cluster.redis[0].url)
    stop_cutting = threading.Event()
    cuts = 0

    def cut_now_and_then() -> None:
        # Each cut breaks the link wherever it is: a frame half written, half answered, or between frames.
        nonlocal cuts
        while not stop_cutting.wait(0.2):
            for proxy in proxies:
                proxy.cut()
                proxy.restore()
            cuts += 1

    cutter = threading.Thread(target=cut_now_and_then, daemon=True)
    try:
        with RawService(cluster.redis[1].url, "echo.cut") as service:
            rets: dict[int, str] = {}
            cutter.start()
            started = time.monotonic()
            # Requests flow all the while the link is cut: ten cuts at least, and until site 1 has given
            # up its links for POSTs (its links kept breaking).
            while cuts < 10 or (FALLBACK not in cluster.sites[0].log() and cuts < 100):
                for _ in range(10):
                    n = len(rets)
                    rets[n] = push_request(
                        conn, [2], "echo.cut", b"%d" % n, exp=60, retries=CUT_TRIES, rpush=True
                    )
                time.sleep(0.02)
            stop_cutting.set()
            cutter.join()
            replies = {n: pop_replies(conn, ret, 1, 60)[0] for n, ret in rets.items()}
        assert sum(proxy.connections for proxy in proxies) >= 5, "the link was not opened again after cuts"
        wrong = {n: (r.err, r.payload) for n, r in replies.items() if (r.err, r.payload) != ("", b"%d" % n)}
        assert wrong == {}, f"{len(wrong)} of {len(replies)} answers are not the echo"
        assert max(service.payloads.values()) == 1
        assert sorted(service.payloads) == sorted(b"%d" % n for n in rets)
        assert time.monotonic() - started < 60
        # Site 1 opened a link, and went on opening it after cuts until it had broken three times (a link cut,
        # or an opening cut mid-handshake, as happens when the machine is slow), then sent POSTs (which the
        # cuts did not stop either).
        assert "opened a link to twin 2" in cluster.sites[0].log()
        assert FALLBACK in cluster.sites[0].log()
    finally:
        stop_cutting.set()
        for proxy in proxies:
            proxy.close()
        conn.close()
        cluster.cleanup()


def test_an_idle_link_is_closed_and_opened_again_when_there_is_work() -> None:
    cluster = LocalCluster(size=2, extra_args=["--link-idle", "1", *LINK_AT_ONCE]).prepare()
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.two"):
            assert round_trip(site1, 2, "echo.two", b"first") == b"first"
            wait_until(
                lambda: all(scrape(site.url)["msgbus_links_open"] == 0 for site in cluster.sites),
                what="the idle link closed at both ends",
            )
            assert round_trip(site1, 2, "echo.two", b"again") == b"again"
            assert scrape(cluster.sites[0].url)["msgbus_links_open"] == 1
        # Whichever end noticed first closed it.
        logs = [site.log() for site in cluster.sites]
        assert any(f"closing the link with twin {3 - n}: idle" in log for n, log in enumerate(logs, start=1))
        # Closed on purpose, not broken: no resends, and no falling back to POSTs.
        assert "broke" not in logs[0]
        metrics = scrape(cluster.sites[0].url)
        assert metrics['msgbus_send_seconds_count{path="link"}'] == 2
        assert metrics['msgbus_send_seconds_count{path="remote"}'] == 0
    finally:
        site1.close()
        cluster.cleanup()


def test_at_most_max_links_are_open_the_least_recently_used_one_closed_first() -> None:
    cluster = LocalCluster(size=3, extra_args=LINK_AT_ONCE).prepare()
    cluster.sites[0].extra_args = [*cluster.sites[0].extra_args, "--max-links", "1"]
    cluster.launch()
    site1 = redis.Redis.from_url(cluster.redis[0].url)
    try:
        with RawService(cluster.redis[1].url, "echo.two"), RawService(cluster.redis[2].url, "echo.three"):
            for n in range(3):
                assert round_trip(site1, 2, "echo.two", b"%d" % n) == b"%d" % n
                assert round_trip(site1, 3, "echo.three", b"%d" % n) == b"%d" % n
                assert scrape(cluster.sites[0].url)["msgbus_links_open"] == 1
        log = cluster.sites[0].log()
        assert log.count("links are open (--max-links") == 5
        assert "broke" not in log
        metrics = scrape(cluster.sites[0].url)
        assert metrics['msgbus_send_seconds_count{path="link"}'] == 6
    finally:
        site1.close()
        cluster.cleanup()
