"""How far each peer's clock is: measured on a link's handshake (signed) or read from a POST answer's Date
(unsigned), what each measurement is trusted for, and what is said of a peer whose clock is off."""

from __future__ import annotations

import logging
import time
from email.utils import formatdate

import pytest
import redis.asyncio as aioredis

from msgbusd.door.http_api import Door
from msgbusd.errors import RejectedRequest, peer_refusal
from msgbusd.identity.signing import Signer
from msgbusd.link.peer_clocks import PeerClocks, clock_text, read_stamp, stamp
from msgbusd.reports.metrics import Metrics
from msgbusd.store.queues import Store
from tests.link.test_link_negotiation import OPENER, SITE, sites
from tests.support.metrics import samples
from twin_resolver.base import Twin
from twin_resolver.static import StaticResolver
from wire.envelope import Envelope
from wire.error_texts import too_old_text

NOW = 1_800_000_000.0
PEER = 2
SIGNER = Signer(b"\x02" * 32, "ed25519")
OTHER = Signer(b"\x03" * 32, "ed25519")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_stamp_is_read_back_only_with_the_nonce_and_key_it_was_signed_for() -> None:
    frame = {"op": "welcome", **stamp(SIGNER, PEER, 1, "n0nce", NOW + 600.25)}
    assert read_stamp(frame, PEER, 1, "n0nce", SIGNER.public_key) == NOW + 600.25
    assert read_stamp(frame, PEER, 1, "another", SIGNER.public_key) is None, "an old stamp played again"
    assert read_stamp(frame, PEER, 1, "n0nce", OTHER.public_key) is None, "not that twin's"
    assert read_stamp(frame, PEER, 3, "n0nce", SIGNER.public_key) is None, "meant for another site"
    assert read_stamp({**frame, "time": NOW}, PEER, 1, "n0nce", SIGNER.public_key) is None, "changed"
    assert read_stamp({"op": "welcome"}, PEER, 1, "n0nce", SIGNER.public_key) is None, "an older site"
    assert read_stamp({**frame, "time": True}, PEER, 1, "n0nce", SIGNER.public_key) is None


def test_a_link_measures_the_offset_between_send_and_answer_and_judges_age_on_it() -> None:
    clocks = PeerClocks(Clock())
    # The peer is ten minutes behind: it stamped its answer 600 s before the middle of the round trip.
    clocks.measured_on_link(PEER, NOW - 600.0, NOW - 0.2, NOW + 0.2)
    assert clocks.offset_s(PEER) == pytest.approx(-600.0)
    stamped = NOW - 630
    assert clocks.fresh_on_senders_clock(PEER, stamped, NOW, 60.0), "30 s old on its clock"
    assert not clocks.fresh_on_senders_clock(PEER, NOW - 700, NOW, 60.0), "100 s old on its clock"
    assert not clocks.fresh_on_senders_clock(3, stamped, NOW, 60.0), "another twin's clock is not known"


def test_a_clock_set_right_while_its_link_stays_open_no_longer_makes_old_stamps_fresh() -> None:
    clocks = PeerClocks(Clock())
    clocks.measured_on_link(PEER, NOW - 600.0, NOW, NOW)
    clocks.signed_stamp(PEER, NOW - 600, NOW)
    clocks.signed_stamp(PEER, NOW - 700, NOW)
    assert clocks.offset_s(PEER) == pytest.approx(-600.0), "stamps it made behind say nothing new"
    # NTP set its clock right: its next message is stamped with this site's time.
    clocks.signed_stamp(PEER, NOW, NOW)
    assert clocks.offset_s(PEER) is None
    assert not clocks.fresh_on_senders_clock(PEER, NOW - 630, NOW, 60.0), "a copy of an old one played again"


def test_a_date_is_said_but_never_trusted_for_age_and_does_not_replace_a_links_measure() -> None:
    clocks = PeerClocks(Clock())
    clocks.heard_date(PEER, formatdate(NOW - 600, usegmt=True), NOW)
    assert clocks.offset_s(PEER) == pytest.approx(-599.5)
    assert clocks.explain(PEER) == clock_text(PEER, -599.5)
    assert not clocks.fresh_on_senders_clock(PEER, NOW - 630, NOW, 60.0), "an unsigned Date proves nothing"
    clocks.measured_on_link(PEER, NOW - 300.0, NOW, NOW)
    clocks.heard_date(PEER, formatdate(NOW - 600, usegmt=True), NOW)
    assert clocks.offset_s(PEER) == pytest.approx(-300.0)


@pytest.mark.parametrize("date", [None, "", "yesterday", "Mon, 99 Foo 2026 99:99:99 GMT"])
def test_a_missing_or_unreadable_date_says_nothing(date: str | None) -> None:
    clocks = PeerClocks(Clock())
    clocks.heard_date(PEER, date, NOW)
    assert clocks.offset_s(PEER) is None and clocks.warnings() == []


def test_a_peer_whose_clock_is_right_costs_nothing() -> None:
    clocks = PeerClocks(Clock())
    clocks.measured_on_link(PEER, NOW + 0.3, NOW, NOW)
    clocks.heard_date(3, formatdate(NOW + 2, usegmt=True), NOW)
    assert clocks.offset_s(PEER) is None and clocks.offset_s(3) is None
    assert clocks.warnings() == []


def test_a_peer_off_is_named_once_in_the_log_in_the_warnings_and_metrics_and_again_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    clocks = PeerClocks(Clock(), metrics)
    with caplog.at_level(logging.INFO, logger="msgbusd.clocks"):
        for _ in range(3):
            clocks.measured_on_link(PEER, NOW + 600.0, NOW, NOW)
        assert clocks.warnings() == [
            "twin 2's clock is 600 s ahead of this site's: messages this site stamps look 600 s old to it, "
            "and go-rmb refuses those older than 60 s; sync its clock or this site's (NTP)"
        ]
        assert samples(metrics.render()[0].decode())['msgbus_peer_clock_offset_seconds{peer="2"}'] == 600.0
        clocks.measured_on_link(PEER, NOW, NOW, NOW)
    assert [record.getMessage() for record in caplog.records] == [
        clocks_warning := clock_text(PEER, 600.0),
        "twin 2's clock is within 5 s of this site's again",
    ]
    assert clocks_warning.startswith("twin 2's clock is 600 s ahead")
    assert clocks.warnings() == []
    assert samples(metrics.render()[0].decode())['msgbus_peer_clock_offset_seconds{peer="2"}'] == 0.0


def test_a_refusal_for_age_from_a_site_whose_clock_is_off_names_the_clock_and_is_final() -> None:
    refusal = too_old_text("10m0s", 1_800_000_000, 1_800_000_600)
    error = peer_refusal(PEER, 400, refusal, clock=clock_text(PEER, 600.0))
    assert error.cause == f"twin 2 refused the message: 400 {refusal}: {clock_text(PEER, 600.0)}"
    assert error.final and error.clock_off
    plain = peer_refusal(PEER, 400, refusal)
    assert not plain.final and not plain.clock_off, "without a known clock, the refusal is as it was"
    other = peer_refusal(PEER, 400, "source twin 9 not found", clock=clock_text(PEER, 600.0))
    assert not other.clock_off and "clock" not in other.cause


async def test_the_door_takes_a_message_fresh_on_its_senders_clock_only_once_a_link_proved_it(
    async_redis: aioredis.Redis,
) -> None:
    resolver = StaticResolver.from_twins([Twin(PEER, "127.0.0.1:2", SIGNER.public_key)])
    clocks = PeerClocks(Clock())
    door = Door(Store(async_redis), resolver, OTHER, freshness_s=60, clock=Clock(), clocks=clocks)
    stamped_by_a_clock_behind = SIGNER.sign(
        Envelope(uid="1", cmd="c", src=PEER, dst=(1,), ret="r", now=int(NOW - 610))
    )
    clocks.heard_date(PEER, formatdate(NOW - 600, usegmt=True), NOW)
    with pytest.raises(RejectedRequest) as refused:
        await door.check(stamped_by_a_clock_behind)
    assert refused.value.message.startswith("message is too old, sent since 10m10s")
    clocks.measured_on_link(PEER, NOW - 600.0, NOW, NOW)
    assert (await door.check(stamped_by_a_clock_behind)).id == PEER
    replayed = SIGNER.sign(Envelope(uid="1", cmd="c", src=PEER, dst=(1,), ret="r", now=int(NOW - 700)))
    with pytest.raises(RejectedRequest):
        await door.check(replayed)


@pytest.mark.parametrize("site_skew_s", [600.0, -600.0])
async def test_each_side_of_a_links_handshake_measures_the_others_clock(site_skew_s: float) -> None:
    async with sites() as (both, _):
        assert both.opener is not None and both.site is not None
        both.site.clocks = PeerClocks(lambda: time.time() + site_skew_s)
        assert await both.opener.link_to(SITE) is not None
        measured = both.opener.clocks.offset_s(SITE)
        assert measured is not None and abs(measured - site_skew_s) < 1
        theirs = both.site.clocks.offset_s(OPENER)
        assert theirs is not None and abs(theirs + site_skew_s) < 1
