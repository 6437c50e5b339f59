"""A link that keeps breaking gives way to POSTs for a while; an uplink never does (the edge has no other way
to be reached), and edges dial a broken uplink again after a delay spread from zero up to the backoff."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from msgbusd.link.links import Links
from msgbusd.link.open_link import Link
from msgbusd.link.posts_instead import FLAPPING_BREAKS
from msgbusd.link.uplinks import UPLINK_REDIAL
from tests.link.link_pair import TIMEOUT_S
from tests.link.test_link_negotiation import KEYS, OPENER, SITE, Sites, sites
from wire.backoff import Backoff

pytestmark = pytest.mark.timeout(60)
GAVE_UP = "sending it POSTs for"


async def break_from_the_site(both: Sites, link: Link) -> None:
    """The site closes ``link`` (as a site that restarts does); the opener notices."""
    assert both.site is not None
    theirs = await both.site.link_to(OPENER, replies_only=True, open_new=False)
    assert theirs is not None
    await theirs.close("the site restarts")
    await asyncio.wait_for(link.ended.wait(), TIMEOUT_S)


def as_uplink(both: Sites) -> Links:
    """The opener of ``both`` made again keeping an uplink to the site (``--uplink``)."""
    assert both.opener is not None
    opener = both.opener
    return Links(
        OPENER,
        KEYS[OPENER],
        opener._resolver,
        both.http,
        opener._answer,
        timeout_s=TIMEOUT_S,
        ping_s=opener._ping_s,
        max_frame_bytes=opener.max_frame_bytes,
        uplinks=(SITE,),
    )


@pytest.mark.parametrize("uplink", [False, True], ids=["link", "uplink"])
async def test_a_link_that_keeps_breaking_gives_way_to_posts_but_an_uplink_never_does(
    uplink: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with sites() as (both, _):
        opener = as_uplink(both) if uplink else both.opener
        assert opener is not None
        try:
            with caplog.at_level(logging.INFO, logger="msgbusd.links"):
                for _ in range(FLAPPING_BREAKS):
                    link = await opener.link_to(SITE, open_new=True)
                    assert link is not None
                    await break_from_the_site(both, link)
                again = await opener.link_to(SITE, open_new=True)
            gave_up = [record.getMessage() for record in caplog.records if GAVE_UP in record.getMessage()]
            if uplink:
                assert again is not None and gave_up == []
            else:
                assert again is None, "sent POSTs a while"
                assert len(gave_up) == 1 and gave_up[0].startswith(f"the link to twin {SITE} broke 3 times")
        finally:
            if uplink:
                await opener.aclose()


def test_a_broken_uplink_is_dialed_again_after_a_delay_from_zero_up_to_the_backoff() -> None:
    backoff = Backoff(UPLINK_REDIAL.base_s, UPLINK_REDIAL.max_s, full_jitter=True, rng=random.Random(7))
    assert UPLINK_REDIAL.full_jitter
    for failures in (1, 3, 10):
        nominal = backoff.nominal_s(failures)
        delays = [backoff.delay_s(failures) for _ in range(2000)]
        assert all(0 <= delay <= nominal for delay in delays)
        # Spread over the whole range: a tenth of the edges in each tenth of it, about.
        tenths = [
            sum(1 for delay in delays if k * nominal / 10 <= delay < (k + 1) * nominal / 10)
            for k in range(10)
        ]
        assert min(tenths) > 120 and max(tenths) < 280, tenths
