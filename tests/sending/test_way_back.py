"""A way back to every edge: a site with no address (``"ip": ""``) that keeps its uplink to one site is
answered by any other msgbus site it calls, over the link it opens to that site, for a lone request as for
steady traffic; a request to a site that takes no links (go-rmb, ``--no-links``) is refused at once, with
why, instead of waiting out its lifetime; an edge that restarts opens the links its answers come back
over."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from testing.local_sites import LocalCluster, wait_until
from tests.support.answers import Answers
from tests.support.services import RawService

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

UPLINK, THIRD, NO_LINKS, EDGE = 1, 2, 3, 4


@pytest.fixture(scope="module")
def sites() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=4).prepare()
    cluster.sites[NO_LINKS - 1].extra_args = [*cluster.sites[NO_LINKS - 1].extra_args, "--no-links"]
    edge = cluster.sites[EDGE - 1]
    edge.advertised_address = ""
    edge.extra_args = [*edge.extra_args, "--uplink", str(UPLINK)]
    cluster.launch()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def answered_within(answers: Answers, timeout_s: float) -> float:
    started = time.monotonic()
    wait_until(answers.done, timeout_s, "every answer")
    return time.monotonic() - started


def test_a_lone_request_from_an_edge_without_an_address_is_answered_by_a_third_site(
    sites: LocalCluster,
) -> None:
    edge_redis = sites.redis[EDGE - 1].url
    with RawService(sites.redis[THIRD - 1].url, "third.echo", handler=lambda data: b"third:" + data) as third:
        answers = Answers(edge_redis)
        answers.push(THIRD, "third.echo", b"lone")
        # The answer comes over the link the edge opened (a POST could not be answered: the edge has no
        # address); it comes at once, far within the request's lifetime.
        answered_within(answers, 20)
        assert answers.first_replies() == answers.echoed(b"third:")
        # Steady traffic: every answer, each once.
        steady = Answers(edge_redis)
        for n in range(50):
            steady.push(THIRD, "third.echo", b"steady%d" % n)
        answered_within(steady, 30)
        assert steady.first_replies() == steady.echoed(b"third:")
        time.sleep(0.5)  # a second reply would come soon after the first
        assert steady.extra() == 0
    assert sorted(third.payloads.values()) == [1] * 51
    third_log = sites.sites[THIRD - 1].log()
    assert "opened a link (its way back: it has no address)" in third_log
    assert "holding messages to twin" not in third_log


def test_an_edge_without_an_address_calling_a_site_that_takes_no_links_gets_why_at_once(
    sites: LocalCluster,
) -> None:
    with RawService(sites.redis[NO_LINKS - 1].url, "plain.echo") as plain:
        answers = Answers(sites.redis[EDGE - 1].url)
        answers.push(NO_LINKS, "plain.echo", b"x")
        answered_within(answers, 20)
    ((err, _),) = answers.first_replies().values()
    assert f"twin {NO_LINKS}'s site takes no links" in err
    assert f"twin {EDGE} has neither an address nor a relay" in err
    # Refused before it was sent: the service never ran it.
    assert plain.payloads == {}


def test_an_edge_without_an_address_that_restarts_opens_the_link_its_answers_wait_for(
    sites: LocalCluster,
) -> None:
    released = threading.Event()

    def slow_echo(data: bytes) -> bytes:
        released.wait(30)
        return b"third:" + data

    edge = sites.sites[EDGE - 1]
    with RawService(sites.redis[THIRD - 1].url, "third.slow", handler=slow_echo) as third:
        answers = Answers(sites.redis[EDGE - 1].url)
        answers.push(THIRD, "third.slow", b"across a restart")
        wait_until(lambda: len(third.requests) == 1, 20, "the request at the third site")
        # The edge goes down while the third site works on the request: the link its answer would have
        # come back over is gone with it.
        edge.kill()
        edge.start()
        released.set()
        answered_within(answers, 20)
    assert answers.first_replies() == answers.echoed(b"third:")
    assert sorted(third.payloads.values()) == [1]
