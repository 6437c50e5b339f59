"""A large backlog: msgbusd's memory while N messages wait for an absent peer, and the cost of expiring them.

Starts two sites, stops twin 2, fills site 1's Redis with N requests waiting for twin 2 (exactly the records
the daemon writes when it accepts a request: backlog entry, deadline, send-queue entry), starts site 1 again
with ``--hold-offline`` and reads its resident memory from /proc while it holds them. Then does it again
with every deadline in the past and measures how fast the expiry timer gives them their timeout errors.
Prints one JSON line.

    python -m bench.backlog [N]
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import redis

from bench.rpc import cpu_seconds, rss_mib
from testing.local_sites import LocalCluster, wait_until
from wire import keys
from wire.envelope import Envelope, encode_payload

BATCH = 10_000


def fill(conn: redis.Redis, count: int, dst: int, deadline: float) -> None:
    """Write what msgbusd records for ``count`` accepted requests to twin ``dst``."""
    original = Envelope(
        cmd="held.echo",
        dst=(dst,),
        ret=str(uuid.uuid4()),
        dat=encode_payload(b"x" * 64),
        exp=3600,
        src=1,
        now=int(time.time()),
    ).encode()
    for start in range(0, count, BATCH):
        uids = [f"{dst}.{n}" for n in range(start + 1, min(start + BATCH, count) + 1)]
        pipe = conn.pipeline(transaction=False)
        pipe.hset(keys.BACKLOG, mapping=dict.fromkeys(uids, original))
        pipe.zadd(keys.DEADLINES, dict.fromkeys(uids, deadline))
        pipe.rpush(keys.send_queue(dst), *(keys.REQUEST_PREFIX + uid for uid in uids))
        pipe.execute()
    conn.set(keys.uid_counter(dst), count)
    conn.sadd(keys.DESTINATIONS, dst)


def held(cluster: LocalCluster, count: int) -> dict[str, float]:
    site1, site2 = cluster.sites
    assert site1.process is not None
    idle = rss_mib(site1.process.pid)
    site1.stop()
    conn = redis.Redis.from_url(cluster.redis[0].url)
    fill(conn, count, site2.twin, time.time() + 3600)
    redis_mib = int(conn.info("memory")["used_memory"]) / 2**20
    site1.start(timeout_s=60)
    wait_until(lambda: "holding messages to twin 2" in site1.log(), 60, "site 1 to hold")
    assert site1.process is not None
    samples = []
    for _ in range(10):
        samples.append(rss_mib(site1.process.pid))
        time.sleep(0.5)
    conn.close()
    return {
        "daemon_rss_idle_mib": round(idle, 1),
        "daemon_rss_holding_mib": round(max(samples), 1),
        "redis_used_mib": round(redis_mib, 1),
    }


def expiry(cluster: LocalCluster, count: int) -> dict[str, float]:
    site1, site2 = cluster.sites
    site1.stop()
    conn = redis.Redis.from_url(cluster.redis[0].url)
    conn.flushdb()
    fill(conn, count, site2.twin, time.time() - 1)
    site1.start(timeout_s=60)
    assert site1.process is not None
    cpu_before = cpu_seconds(site1.process.pid)
    started = time.monotonic()
    wait_until(lambda: conn.hlen(keys.BACKLOG) == 0, 1800, "every request to expire")
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(site1.process.pid) - cpu_before
    conn.close()
    return {
        "expiry_per_s": round(count / elapsed, 1),
        "expiry_daemon_cpu_us_each": round(1e6 * cpu / count, 1),
    }


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    cluster = LocalCluster(size=2, extra_args=["--hold-offline", "--retry-delay", "1"]).start()
    try:
        cluster.sites[1].stop()
        print(json.dumps({"backlog": count, **held(cluster, count), **expiry(cluster, count)}))
    finally:
        cluster.cleanup()


if __name__ == "__main__":
    main()
