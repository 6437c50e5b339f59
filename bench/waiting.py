"""Waiting messages: what a backlog for a down peer costs a site as it grows, and how fast it drains.

For each N, a fresh site (:class:`testing.waiting_backlog.BacklogSite`): N requests (64-byte payloads) are
pushed for a twin that is down, as local clients push them; then, while they wait, the site is measured (the
daemon's resident memory, Redis's memory per waiting message, ``msgbus status`` and ``/healthz`` as an
operator runs them, the round-trip p50 of other traffic to a twin that answers); then the twin comes back
and the drain is timed from its first reply to its last, and checked: every request sent once, in order.
Prints one JSON line per N, then the drain rates' ratios.

    python -m bench.waiting [--waiting 0,10000,100000,1000000] [--hold-offline]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

from testing.waiting_backlog import DOWN_TWIN, BacklogSite

ROUND_TRIPS = 200
# Samples of the operator's view while the messages wait.
STATUS_SAMPLES = 3


def measure(count: int, *, hold_offline: bool) -> dict[str, Any]:
    with BacklogSite(hold_offline=hold_offline) as site:
        # One round trip first: the other twin's link and the daemon's caches are warm before the baseline.
        site.round_trip_p50_ms(20)
        rss_start, redis_start = site.rss_mib(), site.redis_used_bytes()
        started = time.monotonic()
        site.push(count)
        site.wait_waiting(count, timeout_s=3600)
        accept_s = time.monotonic() - started
        # Let a few probe rounds pass (each one writes give-up times) before reading the memory.
        time.sleep(5)
        row: dict[str, Any] = {
            "waiting": count,
            "hold_offline": hold_offline,
            "accepted_per_s": round(count / accept_s, 1) if count else None,
            "rss_start_mib": round(rss_start, 1),
            "rss_waiting_mib": round(site.rss_mib(), 1),
            "redis_bytes_per_message": (
                round((site.redis_used_bytes() - redis_start) / count) if count else None
            ),
        }
        statuses = [site.status() for _ in range(STATUS_SAMPLES)]
        queue = statuses[-1][1]["peers"]
        row["status_s_max"] = round(max(elapsed for elapsed, _ in statuses), 3)
        row["status_queue"] = next((p["queue"] for p in queue if p["twin"] == DOWN_TWIN), 0)
        row["healthz_s_max"] = round(max(site.healthz_s() for _ in range(STATUS_SAMPLES)), 4)
        row["other_p50_ms"] = round(site.round_trip_p50_ms(ROUND_TRIPS), 2)
        if count:
            site.bring_back()
            drain = site.wait_drained(count, timeout_s=3600)
            stats = site.down.stats()
            row["drain_per_s"] = round(drain.per_s, 1)
            row["rss_drained_mib"] = round(site.rss_mib(), 1)
            row["sent_to_twin"] = stats["requests"]["post"] + stats["requests"]["link"]
            row["out_of_order"] = stats["out_of_order"]
        return row


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", default="0,10000,100000,1000000", help="comma-separated backlogs")
    parser.add_argument("--hold-offline", action="store_true", help="run the site with --hold-offline")
    args = parser.parse_args()
    rows = []
    for count in [int(n) for n in args.waiting.split(",")]:
        rows.append(measure(count, hold_offline=args.hold_offline))
        print(json.dumps(rows[-1]), flush=True)
    drained = [row for row in rows if row.get("drain_per_s")]
    for smaller, larger in itertools.pairwise(drained):
        ratio = larger["drain_per_s"] / smaller["drain_per_s"]
        print(f"drain rate at {larger['waiting']:,} / at {smaller['waiting']:,}: {ratio:.2f}")


if __name__ == "__main__":
    main()
