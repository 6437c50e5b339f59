"""A sender's memory of its queue: what it keeps while it catches up, and work announced late."""

from __future__ import annotations

from msgbusd.sending.lanes import KEPT_WHILE_UNTRUSTED, Kept, Lane
from msgbusd.sending.posts import REMOTE_PATH
from msgbusd.sending.send_items import SendItem
from wire.envelope import Envelope


def item(entry: str) -> SendItem:
    return SendItem(entry, REMOTE_PATH, Envelope(uid=entry), original=Envelope())


def entries(lane: Lane) -> list[str]:
    return [queued.entry for queued in lane.fresh]


def test_work_announced_after_it_was_sent_from_redis_is_not_sent_again() -> None:
    lane = Lane(trusted=True)
    lane.sent_from_redis(["req:2.1", "req:2.2"])
    lane.queued([item("req:2.2"), item("req:2.3")])
    assert entries(lane) == ["req:2.3"]


def test_a_sender_catching_up_keeps_what_is_queued_meanwhile_and_sends_the_rest_from_memory() -> None:
    lane = Lane()
    lane.queued([item("req:2.1"), item("req:2.2")])
    # The Redis path sends the queue, which by then held the first of them, then the rest of it.
    lane.sent_from_redis(["req:2.0", "req:2.1"])
    lane.queued([item("req:2.3")])
    lane.sent_from_redis([])
    lane.caught_up()
    assert lane.trusted and entries(lane) == ["req:2.2", "req:2.3"]


def test_a_sender_too_far_behind_forgets_what_was_queued_and_reads_redis_to_its_end() -> None:
    lane = Lane()
    lane.queued([item(f"req:2.{n}") for n in range(KEPT_WHILE_UNTRUSTED)])
    assert not lane.missed and len(lane.fresh) == KEPT_WHILE_UNTRUSTED
    lane.queued([item("req:3.0")])
    assert lane.missed and not lane.fresh


def test_what_is_kept_for_a_sender_not_started_yet_stays_in_order_and_within_bounds() -> None:
    kept = Kept.of([item("req:2.1")], alone=True)
    assert kept.add([item("req:2.2"), item("req:2.3")]) == 2
    assert kept.alone and [queued.entry for queued in kept.items or []] == ["req:2.1", "req:2.2", "req:2.3"]
    # Beyond the bound, nothing is kept: the sender reads its queue, and does not take it for in step.
    assert kept.add([item(f"req:3.{n}") for n in range(KEPT_WHILE_UNTRUSTED)]) == -3
    assert kept.items is None and not kept.alone and len(kept) == 0
    assert kept.add([item("req:4.0")]) == 0 and kept.items is None


def test_work_queued_without_being_known_makes_what_is_kept_of_no_use() -> None:
    kept = Kept.of([item("req:2.1")], alone=True)
    kept.add(None)
    assert kept.items is None and not kept.alone
    # Nothing known from the start: never taken for the whole queue.
    assert not Kept.of(None, alone=True).alone
