"""A site whose Redis fails over: a master with one replica and three real redis-sentinel processes, the
daemon reaching it with a redis+sentinel:// URL and acknowledging hand-offs only once the replica has them
(--redis-wait-replicas 1). The master is killed (-9) while requests flow; once the sentinels have promoted
the replica, the old master is started again (as systemd would) and becomes the new master's replica."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest
from redis import Redis
from redis.exceptions import RedisError

from msgbusd.store.replication import Replication, ReplicationError
from testing.local_sentinel import SentinelGroup
from testing.local_sites import LocalCluster, wait_until
from tests.faults.harness import DAEMON_ARGS, PUSH_ONCE
from tests.support.services import RawService
from wire import keys
from wire.envelope import Envelope, encode_payload
from wire.redis_url import sync_client

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(400)]

CMD = "failover.echo"
REQUESTS = 1000
BATCH = 20
ANSWERING_AGAIN_WITHIN_S = 10.0
# How long the sentinels wait before they take a master for down. While the old master, started again, copies
# the new one, it is the only replica: a pause of the new master taken for its death would promote it half
# empty. Once, in a run of the whole fault suite on a loaded machine, not every request was answered with
# 3,000 (the cause was not seen); the time counted from the failover does not depend on it.
DOWN_AFTER_MS = 5000


@pytest.fixture
def sentinel_site() -> Iterator[tuple[LocalCluster, SentinelGroup]]:
    group = SentinelGroup(down_after_ms=DOWN_AFTER_MS).start()
    cluster = LocalCluster(size=2, extra_args=DAEMON_ARGS).prepare()
    cluster.sites[0].redis_url = group.url
    cluster.sites[0].extra_args = [*DAEMON_ARGS, "--redis-wait-replicas", "1"]
    try:
        cluster.launch()
        yield cluster, group
    finally:
        cluster.cleanup()
        group.cleanup()


class Caller:
    """Pushes the requests through the sentinels, each batch once and only once the replica has it (a batch
    lost with the master is pushed again), and collects the answers."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ret = str(uuid.uuid4())
        self.answers: Counter[int] = Counter()
        self.pushed_at: dict[int, float] = {}
        self.answered_at: dict[int, float] = {}
        self.errors: Counter[str] = Counter()
        self.collecting = threading.Event()

    def push(self, first: int, end: int) -> None:
        conn = sync_client(self.url, socket_timeout=2)
        push_once = conn.register_script(PUSH_ONCE)
        replica = Replication(1, wait_ms=1000)
        for start in range(first, end, BATCH):
            envelopes = [
                Envelope(
                    cmd=CMD,
                    dst=(2,),
                    ret=self.ret,
                    dat=encode_payload(str(i).encode()),
                    exp=90,
                    retries=8,
                    now=int(time.time()),
                ).encode()
                for i in range(start, start + BATCH)
            ]
            while True:
                try:
                    with conn.pipeline(transaction=False) as pipe:
                        marker = f"{self.ret}.pushed.{start}"
                        push_once(keys=[marker, keys.LOCAL], args=envelopes, client=pipe)
                        wanted = replica.queue_on(pipe)
                        answers = pipe.execute()
                    if on_the_replica(replica, answers, wanted):
                        self.pushed_at.update(dict.fromkeys(range(start, start + BATCH), time.monotonic()))
                        break
                except RedisError:
                    pass
                time.sleep(0.1)
            time.sleep(0.03)
        conn.close()

    def collect(self) -> None:
        """Take the answers as a caller that loses none across a failover does: each is moved (BLMOVE) into a
        list of taken answers, counted once the replica has the move, and removed from there. A plain BLPOP
        that the master runs in the instant before it dies takes its answer with it (docs/reliability.md)."""
        conn = sync_client(self.url, socket_timeout=3)
        taken = f"{self.ret}.taken"
        # Answers counted whose removal from the taken list the replica may not have: found there again
        # after a failover, they are removed without being counted again.
        counted: set[bytes] = set()
        replica = Replication(1, wait_ms=1000)
        look_in_taken = True
        while self.collecting.is_set():
            try:
                if look_in_taken:
                    for raw in cast(list[bytes], conn.lrange(taken, 0, -1)):
                        if raw not in counted:
                            self._count(raw)
                        self._remove(conn, replica, taken, raw, counted)
                    look_in_taken = False
                moved, replicated = self._move(conn, replica, taken)
                if moved is not None and replicated:
                    self._count(moved)
                    self._remove(conn, replica, taken, moved, counted)
                elif moved is not None:
                    # Counted from the taken list of the master that has the move, or moved again.
                    look_in_taken = True
            except RedisError:
                look_in_taken = True
                time.sleep(0.1)
        conn.close()

    def _move(self, conn: Redis, replica: Replication, taken: str) -> tuple[bytes | None, bool]:
        """The oldest answer moved into ``taken`` (None after a second without one), and whether the replica
        has the move."""
        with conn.pipeline(transaction=False) as pipe:
            pipe.blmove(self.ret, taken, 1, "RIGHT", "LEFT")
            wanted = replica.queue_on(pipe)
            answers = pipe.execute()
        return answers[0], on_the_replica(replica, answers, wanted)

    @staticmethod
    def _remove(conn: Redis, replica: Replication, taken: str, raw: bytes, counted: set[bytes]) -> None:
        counted.add(raw)
        with conn.pipeline(transaction=False) as pipe:
            pipe.lrem(taken, 1, cast(Any, raw))
            wanted = replica.queue_on(pipe)
            answers = pipe.execute()
        if on_the_replica(replica, answers, wanted):
            counted.discard(raw)

    def _count(self, raw: bytes) -> None:
        reply = Envelope.decode(raw)
        self.answers[int(reply.payload)] += 1
        self.answered_at.setdefault(int(reply.payload), time.monotonic())
        if reply.err:
            self.errors[reply.err[:60]] += 1


def on_the_replica(replication: Replication, answers: list[Any], wanted: int) -> bool:
    """Whether the writes before what ``replication`` queued are done for good, as the daemon counts them
    (--redis-wait-replicas): the replica has them, or the master has none (just after the failover: there
    is nothing it could fail over to)."""
    try:
        replication.check(answers, wanted)
    except ReplicationError:
        return False
    return True


def test_the_master_killed_while_requests_flow(sentinel_site: tuple[LocalCluster, SentinelGroup]) -> None:
    cluster, group = sentinel_site
    caller = Caller(group.url)
    service = RawService(cluster.redis[1].url, CMD)
    service.start()
    caller.collecting.set()
    collector = threading.Thread(target=caller.collect, daemon=True)
    collector.start()
    # The first half flows when the master is killed, the second is pushed after the failover.
    pusher = threading.Thread(target=caller.push, args=(0, REQUESTS // 2), daemon=True)
    try:
        pusher.start()
        wait_until(lambda: len(caller.answers) >= REQUESTS * 0.15, 120, "15% of the answers")
        old_master = group.master_port()
        killed_at = time.monotonic()
        (group.master if group.master.port == old_master else group.replica).kill()  # type: ignore[union-attr]
        wait_until(lambda: group.master_port() != old_master, 60, "the sentinels to promote the replica")
        failed_over_at = time.monotonic()
        group.restart_old_master(old_master)
        pusher.join()
        caller.push(REQUESTS // 2, REQUESTS)
        try:
            wait_until(lambda: len(caller.answers) == REQUESTS, 180, f"{REQUESTS} answers")
        except TimeoutError as exc:
            raise AssertionError(unanswered(caller, group, service, killed_at, failed_over_at)) from exc
        time.sleep(1.0)  # a second answer would come soon after the first
    finally:
        caller.collecting.clear()
        collector.join(timeout=5)
        service.__exit__(None, None, None)
    # From the failover to the first answer to a request pushed after it.
    pushed_after = [index for index, at in caller.pushed_at.items() if at >= failed_over_at]
    answering_again_s = min(caller.answered_at[index] for index in pushed_after) - failed_over_at
    twice = {payload: times for payload, times in service.payloads.items() if times > 1}
    extra = {index: times for index, times in caller.answers.items() if times > 1}
    print(
        f"failover {failed_over_at - killed_at:.1f}s after the kill; answering again "
        f"{answering_again_s:.1f}s after it; errors {dict(caller.errors)}"
    )
    assert caller.errors == Counter()
    assert twice == {}
    assert extra == {}
    assert answering_again_s <= ANSWERING_AGAIN_WITHIN_S


def unanswered(
    caller: Caller, group: SentinelGroup, service: RawService, killed_at: float, failed_over_at: float
) -> str:
    """What went wrong when some requests were never answered: which (and when they were pushed, against the
    kill and the failover), whether the service ran them and where the master holds them now, the failovers
    the sentinels made, and the errors answered."""
    missing = sorted(set(range(REQUESTS)) - caller.answers.keys())
    pushed = [round(caller.pushed_at[index] - killed_at, 1) for index in missing if index in caller.pushed_at]
    ran = [index for index in missing if service.payloads[str(index).encode()]]
    return (
        f"{len(missing)} of {REQUESTS} requests unanswered: {missing[:10]}...{missing[-10:]}, pushed "
        f"{min(pushed, default=None)}..{max(pushed, default=None)} s after the kill (failover at "
        f"{failed_over_at - killed_at:.1f} s); the service ran {ran[:20]}; where the master holds them: "
        f"{held_where(group.url, set(missing[:20]))}; sentinels' switches: {group.master_switches()}; "
        f"errors: {dict(caller.errors)}"
    )


def held_where(url: str, wanted: set[int]) -> str:
    """Which lists and hashes of the master hold a request or an answer with one of the ``wanted``
    payloads."""
    found: dict[str, list[int]] = {}
    try:
        conn = sync_client(url, socket_timeout=5)
        for key in cast(list[bytes], conn.keys("*")):
            kind = conn.type(key)
            if kind == b"list":
                items = cast(list[bytes], conn.lrange(key, 0, -1))
            elif kind == b"hash":
                items = cast(list[bytes], conn.hvals(key))
            else:
                continue
            for item in items:
                try:
                    payload = int(Envelope.decode(item).payload)
                except ValueError:  # not an envelope, or not one of the test's payloads
                    continue
                if payload in wanted:
                    found.setdefault(key.decode(), []).append(payload)
        conn.close()
    except RedisError as exc:
        return f"(the master did not answer: {exc})"
    return str(found)
