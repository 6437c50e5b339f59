"""Fifty thousand requests wait for a twin that is down: the daemon's memory stays flat (what waits is in
Redis, not in the process), the operator's view and other traffic keep answering, and once the twin is back
every request reaches it once, in order, and every reply reaches its caller. (``python -m bench.waiting`` runs
the same with a million, and times it.)"""

from __future__ import annotations

import pytest

from msgbusd.door.handlers import REMEMBERED_REQUESTS
from testing.waiting_backlog import DOWN_TWIN, BacklogSite
from wire.envelope import Envelope

pytestmark = [pytest.mark.processes, pytest.mark.background, pytest.mark.timeout(600)]

WAITING = 50_000
# With --hold-offline (what it adds is the order of the drain, not memory).
WAITING_HOLD_OFFLINE = 20_000
# What the daemon may grow by while they wait: its bounded caches, not anything per waiting message.
RSS_GROWTH_MAX_MIB = 20
# The first requests fill the daemon's bounded caches (it remembers the last REMEMBERED_REQUESTS accepted);
# while the rest is pushed, it may grow by the allocator's steps and less than 100 bytes a message (a million
# waiting would take 100 MiB).
CACHES_FILLED_BY = REMEMBERED_REQUESTS + 5_000
REST_GROWTH_MAX_MIB = 2
REST_GROWTH_MAX_BYTES_PER_MESSAGE = 100


@pytest.mark.parametrize("hold_offline", [False, True], ids=["tries", "hold-offline"])
def test_a_big_backlog_waits_in_redis_and_drains_once_in_order(hold_offline: bool) -> None:
    count = WAITING_HOLD_OFFLINE if hold_offline else WAITING
    with BacklogSite(hold_offline=hold_offline) as site:
        site.round_trip_p50_ms(5)
        rss_start = site.rss_mib()
        site.push(CACHES_FILLED_BY)
        site.wait_waiting(CACHES_FILLED_BY, timeout_s=300)
        rss_filled = site.rss_mib()
        site.push(count - CACHES_FILLED_BY)
        site.wait_waiting(count, timeout_s=300)
        rss_all = site.rss_mib()
        assert rss_all - rss_start < RSS_GROWTH_MAX_MIB
        per_message_mib = REST_GROWTH_MAX_BYTES_PER_MESSAGE * (count - CACHES_FILLED_BY) / 2**20
        assert rss_all - rss_filled < REST_GROWTH_MAX_MIB + per_message_mib, (rss_filled, rss_all)

        _, status = site.status()
        [peer] = [p for p in status["peers"] if p["twin"] == DOWN_TWIN]
        assert (peer["state"], peer["queue"]) == ("down", count)
        assert status["status"] == "degraded"
        assert any(f"{count} message(s) wait for it" in problem for problem in status["problems"])
        # Other traffic goes on (the call raises if it does not get its answer).
        site.round_trip_p50_ms(20)

        site.bring_back()
        site.wait_drained(count, timeout_s=300)
        stats = site.down.stats()
        assert stats["requests"]["post"] + stats["requests"]["link"] == count
        assert stats["out_of_order"] == 0
        assert site.waiting() == 0
        with site.redis() as conn:
            replies = [Envelope.decode(raw) for raw in conn.lrange(site.ret, 0, -1)]
        assert len({reply.uid for reply in replies}) == len(replies) == count
        assert not [reply.err for reply in replies if reply.err]
