"""A site whose clock is ten minutes off (libfaketime on its daemon, as on an edge box that booted without a
battery for its clock): between msgbus sites over a link nothing is lost and both sites name the clock;
toward a site that speaks only go-rmb's protocol, the caller's error names the clock.

The site that speaks only go-rmb's protocol is a msgbus site run with ``--no-links``: it takes POSTs and
judges a message's age on its own clock, with go-rmb's 60 s rule and texts (go-rmb itself is not run here).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest
import redis

from testing.local_sites import LocalCluster, libfaketime
from tests.support.metrics import scrape
from tests.support.services import RawService, pop_replies, push_request

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(libfaketime() is None, reason="needs libfaketime (make setup installs faketime)"),
]

SKEW_S = 600
REQUESTS = 30
FAST = ["--retry-delay", "0.05", "--retry-max-delay", "0.2"]
# A clock read from a POST answer's Date is known to a second or so.
CLOCK_AHEAD = re.compile(
    r"twin 2's clock is (599|600|601) s ahead of this site's: messages this site stamps look \1 s old to it, "
    r"and go-rmb refuses those older than 60 s; sync its clock or this site's \(NTP\)"
)
CLOCK_BEHIND = re.compile(
    r"twin 2's clock is (599|600|601) s behind this site's: messages it stamps look \1 s old to this site, "
    r"and go-rmb refuses those older than 60 s; sync its clock or this site's \(NTP\)"
)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=2, extra_args=FAST).prepare()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def status(url: str) -> dict[str, object]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/status", timeout=10) as response:
        report: dict[str, object] = json.loads(response.read())
    return report


def echoes(redis_url: str, dst: int, count: int) -> list[str]:
    """``count`` requests to twin ``dst``'s ``clock.echo``; the error of each reply ("" when answered)."""
    with redis.Redis.from_url(redis_url) as conn:
        rets = [
            push_request(conn, [dst], "clock.echo", f"{i}".encode(), exp=60, retries=3) for i in range(count)
        ]
        replies = [pop_replies(conn, ret, 1, timeout_s=60)[0] for ret in rets]
    assert all(reply.err or reply.payload == f"{i}".encode() for i, reply in enumerate(replies))
    return [reply.err for reply in replies]


def one_error(redis_url: str, dst: int) -> str:
    return echoes(redis_url, dst, 1)[0]


@pytest.mark.parametrize("skew_s", [-SKEW_S, SKEW_S], ids=["behind", "ahead"])
def test_a_site_ten_minutes_off_over_a_link_loses_nothing_and_both_sites_name_the_clock(
    cluster: LocalCluster, skew_s: int
) -> None:
    here, there = cluster.sites
    there.clock_offset_s = skew_s
    cluster.launch()
    with RawService(cluster.redis[0].url, "clock.echo"), RawService(cluster.redis[1].url, "clock.echo"):
        assert echoes(cluster.redis[0].url, 2, REQUESTS) == [""] * REQUESTS
        assert echoes(cluster.redis[1].url, 1, REQUESTS) == [""] * REQUESTS
    word = "ahead of" if skew_s > 0 else "behind"
    there_word = "behind" if skew_s > 0 else "ahead of"
    (warning,) = status(here.url)["warnings"]  # type: ignore[misc]
    assert warning.startswith(f"twin 2's clock is {SKEW_S} s {word} this site's")
    (warning,) = status(there.url)["warnings"]  # type: ignore[misc]
    assert warning.startswith(f"twin 1's clock is {SKEW_S} s {there_word} this site's")
    offset = scrape(here.url)['msgbus_peer_clock_offset_seconds{peer="2"}']
    assert abs(offset - skew_s) < 2
    assert abs(scrape(there.url)['msgbus_peer_clock_offset_seconds{peer="1"}'] + skew_s) < 2
    # Logged when first measured: from the Date of a POST's answer (to a second) or at the handshake.
    assert re.search(rf"twin 2's clock is (599|600|601) s {word} this site's", here.log())


def test_a_site_ahead_that_speaks_only_go_rmbs_protocol_refuses_requests_and_the_caller_is_told_the_clock(
    cluster: LocalCluster,
) -> None:
    here, there = cluster.sites
    there.extra_args = [*there.extra_args, "--no-links"]
    there.clock_offset_s = SKEW_S
    cluster.launch()
    with RawService(cluster.redis[1].url, "clock.echo"):
        err = one_error(cluster.redis[0].url, 2)
    refusal, clock = err.split(": twin 2's clock")
    clock = "twin 2's clock" + clock
    # go-rmb's text, as the site said it, then the clock.
    assert refusal.startswith(
        "all retries done: twin 2 refused the message: 400 message is too old, sent since 10m"
    )
    assert CLOCK_AHEAD.fullmatch(clock), clock
    assert status(here.url)["warnings"] == [clock]


def test_a_site_behind_that_speaks_only_go_rmbs_protocol_has_its_replies_refused_and_the_caller_told(
    cluster: LocalCluster,
) -> None:
    there = cluster.sites[1]
    there.extra_args = [*there.extra_args, "--no-links"]
    there.clock_offset_s = -SKEW_S
    cluster.launch()
    with RawService(cluster.redis[0].url, "clock.echo"), RawService(cluster.redis[1].url, "clock.echo"):
        err = one_error(cluster.redis[0].url, 2)
        # Its requests are refused here: its own callers are told that this site's clock is ahead.
        theirs = one_error(cluster.redis[1].url, 1)
    refusal, clock = err.split(": twin 2's clock")
    assert refusal.startswith("twin 2's reply was refused: message is too old, sent since 10m")
    assert CLOCK_BEHIND.fullmatch("twin 2's clock" + clock), err
    assert theirs.startswith("all retries done: twin 1 refused the message: 400 message is too old")
    assert "twin 1's clock is 59" in theirs or "twin 1's clock is 60" in theirs, theirs
