"""How much memory msgbusd uses while many messages wait for an absent peer (``--hold-offline``).

Starts two sites, stops twin 2, fills site 1's Redis with N requests waiting for twin 2 (exactly the records
the daemon writes when it accepts a request: backlog entry, deadline, send-queue entry), starts site 1 again
and reads its resident memory from /proc while it holds them. Prints one JSON line.

    python -m bench.held_memory [N]
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import redis

from msgbusd import keys
from msgbusd.envelope import Envelope, encode_payload
from msgbusd.local_sites import LocalCluster, wait_until

BATCH = 10_000


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def fill(conn: redis.Redis, count: int, dst: int) -> None:
    original = Envelope(
        cmd="held.echo",
        dst=(dst,),
        ret=str(uuid.uuid4()),
        dat=encode_payload(b"x" * 64),
        exp=3600,
        src=1,
        now=int(time.time()),
    ).encode()
    deadline = time.time() + 3600
    for start in range(0, count, BATCH):
        uids = [f"{dst}.{n}" for n in range(start + 1, min(start + BATCH, count) + 1)]
        pipe = conn.pipeline(transaction=False)
        pipe.hset(keys.BACKLOG, mapping=dict.fromkeys(uids, original))
        pipe.zadd(keys.DEADLINES, dict.fromkeys(uids, deadline))
        pipe.rpush(keys.send_queue(dst), *uids)
        pipe.execute()
    conn.set(keys.uid_counter(dst), count)
    conn.sadd(keys.DESTINATIONS, dst)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    cluster = LocalCluster(size=2, extra_args=["--hold-offline", "--retry-delay", "1"]).start()
    try:
        site1, site2 = cluster.sites
        assert site1.process is not None
        idle = rss_mib(site1.process.pid)
        site2.stop()
        site1.stop()
        conn = redis.Redis.from_url(cluster.redis[0].url)
        started = time.monotonic()
        fill(conn, count, site2.twin)
        fill_s = time.monotonic() - started
        redis_mib = int(conn.info("memory")["used_memory"]) / 2**20
        site1.start(timeout_s=60)
        wait_until(lambda: "holding messages to twin 2" in site1.log(), 60, "site 1 to hold")
        assert site1.process is not None
        samples = []
        for _ in range(10):
            samples.append(rss_mib(site1.process.pid))
            time.sleep(0.5)
        print(
            json.dumps(
                {
                    "held_messages": count,
                    "daemon_rss_idle_mib": round(idle, 1),
                    "daemon_rss_holding_mib": round(max(samples), 1),
                    "redis_used_mib": round(redis_mib, 1),
                    "fill_s": round(fill_s, 1),
                    "send_queue_length": conn.llen(keys.send_queue(site2.twin)),
                }
            )
        )
        conn.close()
    finally:
        cluster.cleanup()


if __name__ == "__main__":
    main()
