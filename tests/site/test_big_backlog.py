"""A hundred thousand requests wait for a twin that is down: the daemon's memory stays flat (what waits is in
Redis, not in the process), the operator's view and other traffic keep answering, and once the twin is back
every request reaches it once, in order, and every reply reaches its caller. (``python -m bench.waiting`` runs
the same with a million, and times it.)"""

from __future__ import annotations

import pytest

from testing.waiting_backlog import DOWN_TWIN, BacklogSite
from wire.envelope import Envelope

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

WAITING = 100_000
# What the daemon may grow by while they wait: its bounded caches, not anything per waiting message (a
# million would be hundreds of MiB).
RSS_GROWTH_MAX_MIB = 20


@pytest.mark.parametrize("hold_offline", [False, True], ids=["tries", "hold-offline"])
def test_a_big_backlog_waits_in_redis_and_drains_once_in_order(hold_offline: bool) -> None:
    count = WAITING if not hold_offline else WAITING // 5
    with BacklogSite(hold_offline=hold_offline) as site:
        site.round_trip_p50_ms(5)
        rss_start = site.rss_mib()
        site.push(count)
        site.wait_waiting(count, timeout_s=300)
        assert site.rss_mib() - rss_start < RSS_GROWTH_MAX_MIB

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
