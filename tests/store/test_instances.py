"""A site's instances in a real Redis: heartbeats, leases given once, and taking over a dead instance."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from msgbusd.site.instance import UPLINKS_READ_SPACING, Instance
from msgbusd.store.instances import (
    UPLINK_CHANGES_KEPT,
    InstanceStore,
    UplinkChange,
    announcement,
    read_announcement,
)
from msgbusd.store.leases import CARRIED_BYTES, Leases, Notice
from wire import keys

LEASE_S = 5.0


class FakeClock:
    """An instance's clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_free_lease_goes_to_its_live_pick_and_stays_with_a_live_holder(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    await store.heartbeat("a", {}, 60)
    await store.heartbeat("b", {}, 60)
    assert await store.claim("a", {"7": "b", "8": "a"}, LEASE_S, "none") == {"7": "b", "8": "a"}
    # Held by live instances: another proposal changes nothing.
    assert await store.claim("b", {"7": "a", "8": "b"}, LEASE_S, "none") == {"7": "b", "8": "a"}


async def test_a_lease_of_a_dead_instance_or_proposed_to_one_goes_to_the_caller(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    await store.heartbeat("a", {}, 60)
    await async_redis.zadd(keys.INSTANCES, {"gone": 1.0})
    await async_redis.hset(keys.OWNERS, "7", "gone")
    assert await store.claim("a", {"7": "gone", "8": "never-seen"}, LEASE_S, "none") == {"7": "a", "8": "a"}


async def test_the_holder_is_told_of_new_work_on_its_wake_channel(async_redis: aioredis.Redis) -> None:
    store = InstanceStore(async_redis)
    await store.heartbeat("a", {}, 60)
    await store.heartbeat("b", {}, 60)
    pubsub = async_redis.pubsub()
    await pubsub.subscribe(keys.wake_channel("b"))
    await pubsub.get_message(timeout=1)  # the subscription's confirmation
    await store.claim("a", {"7": "b"}, LEASE_S, "changed")  # given to b: told
    await store.claim("a", {"7": "b"}, LEASE_S, "changed")  # unchanged: not told
    await store.claim("a", {"7": "b"}, LEASE_S, "all")  # new work: told
    await store.hand_over("b", {"7": "a"})  # b hands it on: a is told, not b
    told = []
    while (message := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)) is not None:
        told.append(message["data"])
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert told == [b"7", b"7"]
    assert await async_redis.hgetall(keys.OWNERS) == {b"7": b"a"}


async def test_only_the_holder_hands_a_lease_on(async_redis: aioredis.Redis) -> None:
    store = InstanceStore(async_redis)
    await store.heartbeat("a", {}, 60)
    await store.claim("a", {"7": "a", "8": "a"}, LEASE_S, "none")
    assert await store.hand_over("b", {"7": "b"}) == 0
    assert await store.hand_over("a", {"7": "b", "8": ""}) == 2
    assert await async_redis.hgetall(keys.OWNERS) == {b"7": b"b"}


async def test_a_dead_instance_is_buried_once_and_its_items_go_back_to_the_head_in_order(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    beat = await store.heartbeat("dead", {"listen": "x"}, 60)
    await async_redis.rpush(keys.LOCAL, b"3")
    await async_redis.rpush(keys.instance_processing(keys.LOCAL, "dead"), b"1", b"2")
    await async_redis.rpush(keys.instance_processing(keys.REPLY, "dead"), b"r")
    # It beat after the time it was judged by: alive after all, nothing moves.
    last_beat = beat.beats["dead"]
    assert await store.bury("dead", last_beat - 1, keys.SYSTEM_QUEUES) is None
    assert await async_redis.llen(keys.instance_processing(keys.LOCAL, "dead")) == 2
    assert await store.bury("dead", last_beat, keys.SYSTEM_QUEUES) == 3
    assert await async_redis.lrange(keys.LOCAL, 0, -1) == [b"1", b"2", b"3"]
    assert await async_redis.lrange(keys.REPLY, 0, -1) == [b"r"]
    assert await async_redis.zscore(keys.INSTANCES, "dead") is None
    assert await store.describe("dead") == {}
    assert await store.bury("dead", last_beat, keys.SYSTEM_QUEUES) == 0


async def test_a_heartbeat_says_whether_the_instance_was_still_counted(async_redis: aioredis.Redis) -> None:
    store = InstanceStore(async_redis)
    first = await store.heartbeat("a", {"owned": "0"}, 60)
    second = await store.heartbeat("a", {"owned": "2"}, 60)
    await store.leave("a")
    after_leaving = await store.heartbeat("a", {}, 60)
    assert (first.was_present, second.was_present, after_leaving.was_present) == (False, True, False)
    assert second.now >= first.now and set(second.beats) == {"a"}
    assert (
        await store.describe("a") == {}
    )  # leaving removed what it said of itself; the last beat said nothing


async def test_a_lease_goes_only_once_its_work_is_done() -> None:
    leases = Leases("a")
    leaving: list[str] = []
    leases.on_leaving = leaving.append
    leases.gained("7")
    with leases.using("7"):
        leases.let_go("7")
        assert not leases.holds("7") and leaving == ["7"]
        assert leases.releasable() == set()
    assert leases.releasable() == {"7"}
    # While it is being handed on, work wanting it waits for its next holder instead of claiming it back.
    leases.want("7")
    assert leases.take_claims() == (set(), set(), {})


async def test_a_freed_lease_wanted_again_is_claimed_once_it_is_free() -> None:
    leases = Leases("a")
    leases.gained("7")
    leases.gained("8")
    leases.free("7")
    leases.let_go("8")
    assert not leases.holds("7") and leases.frees("7") and not leases.frees("8")
    # Work for a lease being freed is kept (True), unlike work for one being handed on.
    assert leases.want("7") and not leases.want("8")
    # Claimed meanwhile (told by another instance), it is still ours to free first.
    leases.gained("7")
    assert not leases.holds("7")
    assert leases.take_claims() == (set(), set(), {})
    leases.released(leases.releasable())
    assert not leases.frees("7")
    assert leases.take_claims() == ({"7"}, set(), {})


async def test_a_freed_lease_goes_to_no_one_while_a_lease_let_go_goes_to_another_instance(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    for name in ("a", "b"):
        await store.heartbeat(name, {}, 60)
    await store.claim("a", {"7": "a", "8": "a"}, LEASE_S, "none")
    leases = Leases("a")
    instance = Instance(store, leases, lease_s=LEASE_S, queues=[], pending=no_destinations)
    instance.live = ["a", "b"]
    leases.gained("7")
    leases.gained("8")
    leases.free("7")
    leases.let_go("8")
    await instance.settle_claims()
    assert await async_redis.hgetall(keys.OWNERS) == {b"8": b"b"}
    assert not leases.frees("7")


async def no_destinations() -> list[int]:
    return []


async def test_work_under_a_lease_runs_while_it_is_held_and_stops_when_it_goes() -> None:
    leases = Leases("a")
    stopping = asyncio.Event()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def work(lost: asyncio.Event) -> None:
        started.set()
        await lost.wait()
        stopped.set()

    runner = asyncio.create_task(leases.run_while_held(keys.LOCAL_LEASE, work, stopping))
    await asyncio.sleep(0.05)
    assert not started.is_set()
    leases.gained(keys.LOCAL_LEASE)
    await asyncio.wait_for(started.wait(), 5)
    assert leases.releasable() == set()
    leases.let_go(keys.LOCAL_LEASE)
    await asyncio.wait_for(stopped.wait(), 5)
    await asyncio.sleep(0.01)
    assert leases.releasable() == {keys.LOCAL_LEASE}
    stopping.set()
    await asyncio.wait_for(runner, 5)


async def test_other_work_runs_while_a_lease_is_not_held_and_makes_way_when_it_is() -> None:
    leases = Leases("a")
    stopping = asyncio.Event()
    ran: asyncio.Queue[str] = asyncio.Queue()

    def runs(what: str) -> Callable[[asyncio.Event], Awaitable[None]]:
        async def work(until: asyncio.Event) -> None:
            ran.put_nowait(what)
            await until.wait()
            ran.put_nowait(f"{what} done")

        return work

    async def next_ran() -> str:
        return await asyncio.wait_for(ran.get(), 5)

    runner = asyncio.create_task(
        leases.run_while_held(keys.REPLY_LEASE, runs("held"), stopping, meanwhile=runs("meanwhile"))
    )
    assert await next_ran() == "meanwhile"
    leases.gained(keys.REPLY_LEASE)
    assert [await next_ran() for _ in range(2)] == ["meanwhile done", "held"]
    leases.let_go(keys.REPLY_LEASE)
    assert [await next_ran() for _ in range(2)] == ["held done", "meanwhile"]
    stopping.set()
    await asyncio.wait_for(runner, 5)
    assert await next_ran() == "meanwhile done"


async def test_work_announced_for_a_held_lease_starts_at_once_without_a_claim() -> None:
    leases = Leases("a")
    told: list[tuple[str, bytes | None]] = []
    leases.on_told = lambda name, carried: told.append((name, carried))
    leases.gained("7")
    leases.told("7")
    leases.told("7", b"work")
    leases.told("8", b"work")
    assert told == [("7", None), ("7", b"work")]
    # A lease not held here is claimed first (the announcement may be stale).
    assert leases.take_claims() == (set(), {"8"}, {})


async def test_new_work_goes_straight_to_a_known_holder_and_is_claimed_when_it_no_longer_listens(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    leases = Leases("a")
    leases.held_elsewhere("7", "b")
    leases.held_elsewhere("9", "gone")
    leases.want("7", b"first")
    leases.want("7", b"second")
    leases.want("8")
    leases.want("9")
    notices = {"7": Notice("b", b"first\nsecond"), "9": Notice("gone")}
    assert leases.take_claims() == ({"8"}, set(), notices)
    pubsub = async_redis.pubsub()
    await pubsub.subscribe(keys.wake_channel("b"))
    await pubsub.get_message(timeout=1)
    assert await store.announce(notices) == {"9"}
    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert message is not None and read_announcement(message["data"]) == ("7", b"first\nsecond")
    leases.forget_holders({"7"})
    leases.want("7")
    assert leases.take_claims() == ({"7"}, set(), {})


async def test_work_too_big_to_carry_is_announced_by_name_only() -> None:
    leases = Leases("a")
    leases.held_elsewhere("7", "b")
    leases.held_elsewhere("8", "b")
    leases.want("7", b"x" * CARRIED_BYTES)
    leases.want("7", b"y")
    leases.want("8", b"z")
    leases.want("8")
    # Work known only in part is read from Redis by its holder.
    assert leases.take_claims() == (set(), set(), {"7": Notice("b"), "8": Notice("b")})
    assert read_announcement(announcement("7", None)) == ("7", None)


async def test_a_sweep_has_held_leases_looked_at_again_only_when_work_may_have_come_unheard(
    async_redis: aioredis.Redis,
) -> None:
    now = [1000.0]
    store = InstanceStore(async_redis)
    leases = Leases("a")
    gained: list[tuple[str, bool]] = []
    leases.on_gained = lambda name, resumed: gained.append((name, resumed))
    unattended: list[str] = []
    leases.on_still_held = unattended.append

    async def destination_7() -> list[int]:
        return [7]

    instance = Instance(
        store, leases, lease_s=LEASE_S, queues=[], pending=destination_7, clock=lambda: now[0]
    )

    async def sweep() -> list[str]:
        gained.clear()
        now[0] += 10  # past the next sweep
        await instance.beat_and_settle()
        return [name for name, _ in gained if name.isdigit()]

    await instance.beat_and_settle(force_sweep=True)
    assert ("7", True) in gained  # what a previous run left is taken over
    # Alone, this instance queued all the work under its leases itself: nothing to look at again, only a
    # sender to start where work waits without one.
    assert await sweep() == []
    assert [name for name in unattended if name.isdigit()] == ["7"]
    # Another instance live: it may have queued work for 7 unheard.
    await store.heartbeat("b", {}, 60)
    assert await sweep() == ["7"]


async def test_uplinks_are_recorded_together_and_a_closed_one_is_forgotten_only_by_its_instance(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    await async_redis.sadd(keys.DESTINATIONS, "8")  # something waits to be sent to twin 8
    assert await store.uplinks_changed("a", [7, 8, 9], []) == [8]
    assert await store.uplinks_changed("b", [9], [7]) == []  # 7 is a's: b does not forget it
    assert await store.uplinks_changed("a", [], [7, 9]) == []  # 9 is b's by now
    assert await async_redis.hgetall(keys.UPLINKS) == {b"8": b"a", b"9": b"b"}
    assert (await store.heartbeat("a", {}, 60)).uplinks_version == 3


async def test_uplinks_that_open_are_recorded_by_the_loop_and_only_a_twin_with_work_gets_its_lease(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    await store.heartbeat("a", {}, 60)
    await async_redis.sadd(keys.DESTINATIONS, "8")
    leases = Leases("a")
    instance = Instance(store, leases, lease_s=LEASE_S, queues=[], pending=no_destinations)
    for twin in (7, 8, 9):
        await instance.uplink_changed(twin, opened=True)
    await instance.uplink_changed(9, opened=False)
    assert instance.preferred == {"7": "a", "8": "a"}
    assert await async_redis.hgetall(keys.UPLINKS) == {}, "recorded together, by the instance's loop"
    await asyncio.wait_for(leases.work.wait(), 5)
    await instance.settle_claims()
    assert await async_redis.hgetall(keys.UPLINKS) == {b"7": b"a", b"8": b"a"}
    # An idle edge needs no sender: only 8, which has work waiting, is claimed.
    assert leases.holds("8") and not leases.holds("7")


async def test_an_instance_reads_the_others_uplinks_only_when_they_changed_and_then_only_what_changed(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    reads: list[str] = []
    read_whole, read_changes = store.uplink_holders, store.uplink_changes_since

    async def whole() -> tuple[dict[str, str], int]:
        reads.append("whole")
        return await read_whole()

    async def changes(version: int) -> list[UplinkChange] | None:
        reads.append("changes")
        return await read_changes(version)

    store.uplink_holders = whole  # type: ignore[method-assign]
    store.uplink_changes_since = changes  # type: ignore[method-assign]
    clock = FakeClock()
    instance = Instance(store, Leases("b"), lease_s=LEASE_S, queues=[], pending=no_destinations, clock=clock)
    await instance.beat_and_settle()
    assert reads == [], "alone, it knows its own uplinks"
    await store.heartbeat("a", {}, 60)
    await store.uplinks_changed("a", [7, 9], [])
    clock.now += 1
    await instance.beat_and_settle()
    assert (reads, instance.preferred) == (["whole"], {"7": "a", "9": "a"})
    clock.now += 1
    await instance.beat_and_settle()
    assert reads == ["whole"], "nothing changed"
    await store.uplinks_changed("a", [8], [7])
    await store.uplinks_changed("c", [9], [])
    await instance.uplink_changed(10, opened=True)  # not recorded yet
    clock.now += 1
    await instance.beat_and_settle()
    assert reads == ["whole", "changes"]
    assert instance.preferred == {"8": "a", "9": "c", "10": "b"}
    assert instance.preferred == {
        twin.decode(): holder.decode() for twin, holder in (await async_redis.hgetall(keys.UPLINKS)).items()
    } | {"10": "b"}


async def test_an_instance_that_missed_more_changes_than_redis_keeps_reads_the_uplinks_whole(
    async_redis: aioredis.Redis,
) -> None:
    store = InstanceStore(async_redis)
    clock = FakeClock()
    instance = Instance(store, Leases("b"), lease_s=LEASE_S, queues=[], pending=no_destinations, clock=clock)
    await store.heartbeat("a", {}, 60)
    await store.uplinks_changed("a", [1], [])
    await instance.beat_and_settle()
    assert instance.preferred == {"1": "a"}
    for twin in range(2, UPLINK_CHANGES_KEPT + 3):
        await store.uplinks_changed("a", [twin], [twin - 1])
    assert await async_redis.llen(keys.UPLINK_CHANGES) == UPLINK_CHANGES_KEPT
    assert await store.uplink_changes_since(1) is None
    clock.now += 1
    await instance.beat_and_settle()
    assert instance.preferred == {str(UPLINK_CHANGES_KEPT + 2): "a"}
    # Redis lost them (restarted empty): the map is read whole again, whatever the version says.
    await async_redis.flushdb()
    await store.heartbeat("a", {}, 60)
    await store.uplinks_changed("a", [5], [])
    clock.now += 1
    await instance.beat_and_settle()
    assert instance.preferred == {"5": "a"}


async def test_a_slow_read_of_the_others_uplinks_spaces_the_next_ones(async_redis: aioredis.Redis) -> None:
    store = InstanceStore(async_redis)
    reads = 0
    read_whole, read_changes = store.uplink_holders, store.uplink_changes_since
    read_s = 0.05

    async def slow() -> tuple[dict[str, str], int]:
        nonlocal reads
        reads += 1
        await asyncio.sleep(read_s)  # as a map of 100,000 edges takes
        return await read_whole()

    async def slow_changes(version: int) -> list[UplinkChange] | None:
        nonlocal reads
        reads += 1
        await asyncio.sleep(read_s)  # as the changes of a herd of 100,000 edges may take
        return await read_changes(version)

    store.uplink_holders = slow  # type: ignore[method-assign]
    store.uplink_changes_since = slow_changes  # type: ignore[method-assign]
    clock = FakeClock()
    instance = Instance(store, Leases("b"), lease_s=LEASE_S, queues=[], pending=no_destinations, clock=clock)
    await store.heartbeat("a", {}, 60)
    await store.uplinks_changed("a", [7], [])
    await instance.beat_and_settle()
    assert (reads, instance.preferred) == (1, {"7": "a"})
    # Changed again at once: read again only once UPLINKS_READ_SPACING times the last read has passed.
    await store.uplinks_changed("a", [8], [])
    clock.now += 0.5 * UPLINKS_READ_SPACING * read_s
    await instance.beat_and_settle()
    assert (reads, instance.preferred) == (1, {"7": "a"})
    clock.now += UPLINKS_READ_SPACING * read_s
    await instance.beat_and_settle()
    assert (reads, instance.preferred) == (2, {"7": "a", "8": "a"})
