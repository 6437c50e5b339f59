"""A site of several msgbusd processes: any of them killed (-9) at random and started again while requests
flow. Both sites run three processes sharing their port (--reuse-port); the audit is the bus's promise
(every request answered once, none executed twice) and a bound on how long any answer took."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from testing.local_sites import LocalCluster, SiteProcess, wait_until
from tests.faults.harness import DAEMON_ARGS
from tests.support.services import RawService
from wire import keys
from wire.envelope import Envelope, encode_payload

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(400)]

CMD = "processes.echo"
REQUESTS = 1500
CHAOS_S = 20.0
# The chaos goes on past CHAOS_S until this many kills (a loaded machine restarts processes slowly, and a
# process still starting is not killed), for at most CHAOS_MAX_S.
KILLS_AT_LEAST = 10
CHAOS_MAX_S = 60.0
ANSWER_WITHIN_S = 15.0


@pytest.fixture
def three_per_site() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=2, processes=3, extra_args=DAEMON_ARGS).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


def kill_at_random(processes: list[SiteProcess], started: float, kills: Counter[int]) -> None:
    """For CHAOS_S from ``started`` and until KILLS_AT_LEAST kills: every 0.4-1.5 s, kill a random process
    that runs with -9, and start it again 0.2-1 s later (in the background: the next kill does not wait for
    it to be ready)."""
    chance = random.Random(23)
    restarts: list[threading.Thread] = []
    restarting: set[int] = set()

    def restart(index: int, after_s: float) -> None:
        time.sleep(after_s)
        processes[index].start(timeout_s=60)
        restarting.discard(index)

    def going_on() -> bool:
        elapsed = time.monotonic() - started
        return elapsed < CHAOS_S or (sum(kills.values()) < KILLS_AT_LEAST and elapsed < CHAOS_MAX_S)

    while going_on():
        time.sleep(chance.uniform(0.4, 1.5))
        running = [index for index in range(len(processes)) if index not in restarting]
        # Each site keeps one process running (killing its last would be a site down, another scenario).
        candidates = [
            index
            for index in running
            if sum(processes[other].twin == processes[index].twin for other in running) > 1
        ]
        if not candidates:
            continue
        index = chance.choice(candidates)
        processes[index].kill()
        kills[processes[index].twin] += 1
        restarting.add(index)
        restarts.append(threading.Thread(target=restart, args=(index, chance.uniform(0.2, 1.0))))
        restarts[-1].start()
    for thread in restarts:
        thread.join()


def test_any_process_of_either_site_killed_at_random(three_per_site: LocalCluster) -> None:
    cluster = three_per_site
    ret = str(uuid.uuid4())
    pushed_at: dict[int, float] = {}
    answered: dict[int, list[tuple[float, str]]] = {}
    kills: Counter[int] = Counter()
    every_process = [process for twin in (1, 2) for process in cluster.processes_of(twin)]
    service = RawService(cluster.redis[1].url, CMD)
    service.start()
    collecting = threading.Event()
    collecting.set()

    def collect() -> None:
        with redis.Redis.from_url(cluster.redis[0].url) as conn:
            while collecting.is_set():
                found = conn.blpop([ret], timeout=0.5)
                if found is not None:
                    reply = Envelope.decode(found[1])
                    answered.setdefault(int(reply.payload), []).append((time.monotonic(), reply.err))

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    chaos = threading.Thread(
        target=kill_at_random, args=(every_process, time.monotonic(), kills), daemon=True
    )
    try:
        chaos.start()
        with redis.Redis.from_url(cluster.redis[0].url) as conn:
            for start in range(0, REQUESTS, 25):
                batch = range(start, start + 25)
                requests = [
                    Envelope(
                        cmd=CMD, dst=(2,), ret=ret, dat=encode_payload(str(i).encode()), exp=90, retries=8
                    )
                    for i in batch
                ]
                now = time.monotonic()
                conn.rpush(
                    keys.LOCAL, *(request.replace(now=int(time.time())).encode() for request in requests)
                )
                pushed_at.update(dict.fromkeys(batch, now))
                time.sleep(CHAOS_S / (REQUESTS / 25))
        chaos.join()
        wait_until(lambda: len(answered) == REQUESTS, 120, f"{REQUESTS} answers")
        # A second answer would come soon after the first: give it a moment.
        time.sleep(2.0)
    finally:
        collecting.clear()
        collector.join(timeout=5)
        service.__exit__(None, None, None)
    errors = Counter(err for outcomes in answered.values() for _, err in outcomes if err)
    extra = {index: len(outcomes) for index, outcomes in answered.items() if len(outcomes) > 1}
    twice = {payload: times for payload, times in service.payloads.items() if times > 1}
    slowest = max(outcomes[0][0] - pushed_at[index] for index, outcomes in answered.items())
    print(f"kills per site {dict(kills)}; slowest answer {slowest:.1f}s; errors {dict(errors)}")
    assert sum(kills.values()) >= KILLS_AT_LEAST
    assert errors == Counter()
    assert extra == {}
    assert twice == {}
    assert slowest <= ANSWER_WITHIN_S
