"""Large frames go over a link in parts: they arrive whole and unchanged, small frames and acks go between
their parts, a peer that does not read parts is written whole frames, and parts that cannot be taken close
their link only."""

from __future__ import annotations

import asyncio
import math
import string

import orjson
import pytest

from msgbusd.link.link_parts import (
    PART_BYTES,
    PARTIAL_FRAMES,
    TOO_BIG,
    UNREADABLE,
    PartError,
    Reassembly,
    part,
)
from msgbusd.link.link_sockets import LinkClosed
from msgbusd.link.link_writer import FairWriter
from msgbusd.link.open_link import Result, send_envelopes
from tests.link.link_pair import (
    LONG_REFUSAL,
    LOOPS,
    OPENER,
    REFUSAL_CHARS,
    SITE,
    TIMEOUT_S,
    link_pair,
    message,
    run_on,
    serving_site,
)

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024
SEND_WRAPPING = len(b'{"op":"send","id":1,"messages":[]}')
MESSAGE_WRAPPING = len(message(""))
# Frame sizes around a part's, and one of megabytes.
FRAME_SIZES = [PART_BYTES - 1, PART_BYTES, PART_BYTES + 1, 2 * PART_BYTES, 2 * PART_BYTES + 1, 3 * MIB + 5]


def text(size: int, first: str = "") -> str:
    """``size`` characters starting with ``first``, whose slices of a part's size all differ from their
    neighbours' (a slice out of place shows)."""
    filler = string.ascii_letters * (size // len(string.ascii_letters) + 1)
    return (first + filler)[:size]


def expected_parts(part_id: int, size: int) -> list[tuple[object, ...]]:
    count = math.ceil(size / PART_BYTES)
    return [
        ("part", part_id, n == 0, n == count - 1, min(PART_BYTES, size - n * PART_BYTES))
        for n in range(count)
    ]


@pytest.mark.parametrize("size", [1, PART_BYTES - 1, PART_BYTES, PART_BYTES + 1, 3 * PART_BYTES - 1])
def test_parts_put_together_are_the_frame(size: int) -> None:
    frame = text(size).encode()
    parts = [part(7, frame, start) for start in range(0, size, PART_BYTES)]
    reassembly = Reassembly(max_frame_bytes=size)
    assert [reassembly.add(piece) for piece in parts[:-1]] == [None] * (len(parts) - 1)
    assert reassembly.holding == (len(parts) > 1)
    assert reassembly.add(parts[-1]) == frame
    assert not reassembly.holding


def header(flags: int, part_id: int) -> bytes:
    return bytes([0, flags]) + part_id.to_bytes(8, "big")


BAD_PARTS = {
    "too short": ([b"\x00\x03\x00"], UNREADABLE, "carries nothing"),
    "no slice": ([header(3, 1)], UNREADABLE, "carries nothing"),
    "unknown flags": ([header(8, 1) + b"x"], UNREADABLE, "a part with the header 0008"),
    "a continuation of nothing": (
        [header(2, 5) + b"x"],
        UNREADABLE,
        "frame 5, whose first part did not come",
    ),
    "started twice": ([header(1, 1) + b"x", header(1, 1) + b"x"], UNREADABLE, "part id 1 started again"),
    "too many at once": (
        [header(1, n) + b"x" for n in range(PARTIAL_FRAMES + 1)],
        UNREADABLE,
        f"more than {PARTIAL_FRAMES} frames in parts at once",
    ),
    "too big": ([header(1, 1) + b"x" * 100, header(0, 1) + b"x" * 100], TOO_BIG, "larger than 150 bytes"),
}


@pytest.mark.parametrize("case", BAD_PARTS)
def test_parts_that_cannot_be_taken_are_refused_with_why(case: str) -> None:
    parts, code, why = BAD_PARTS[case]
    reassembly = Reassembly(max_frame_bytes=150)
    with pytest.raises(PartError) as refused:
        for piece in parts:
            reassembly.add(piece)
    assert why in str(refused.value)
    assert refused.value.code == code


class Cable:
    """The names of the frames a writer wrote, a name for each piece; ``names`` by whole frame, or by
    ``#part id`` for the parts of one."""

    def __init__(self, names: dict[bytes, str]) -> None:
        self.names = names
        self.written: list[str] = []

    async def send(self, data: bytes) -> None:
        if data[:1] == b"\x00":
            self.written.append(self.names[b"#%d" % int.from_bytes(data[2:10], "big")])
        else:
            self.written.append(self.names[data])


async def test_small_frames_go_before_the_next_part_and_large_frames_take_turns() -> None:
    large = [text(3 * PART_BYTES, name).encode() for name in "ab"]
    # Parts are numbered in the order their frames were queued.
    cable = Cable({b"#1": "a", b"#2": "b", b"s1": "s1", b"s2": "s2", b"s3": "s3", b"s4": "s4"})
    fourth, held = asyncio.Event(), asyncio.Event()

    async def send(data: bytes) -> None:
        await cable.send(data)
        if len(cable.written) == 4:
            fourth.set()
            await held.wait()

    writer = FairWriter(send, parts=True)
    writes = [asyncio.ensure_future(writer.write(frame)) for frame in [*large, b"s1", b"s2"]]
    await fourth.wait()
    # Queued while a part is being written: both go before the next part.
    writes += [asyncio.ensure_future(writer.write(frame)) for frame in [b"s3", b"s4"]]
    held.set()
    await asyncio.gather(*writes)
    assert cable.written == ["s1", "s2", "a", "b", "s3", "s4", "a", "b", "a", "b"]


async def test_frames_queued_while_a_small_one_is_written_at_once_follow_it_in_turns() -> None:
    cable = Cable({b"#1": "a", b"s1": "s1", b"s2": "s2"})
    writing, held = asyncio.Event(), asyncio.Event()

    async def send(data: bytes) -> None:
        if data == b"s1":
            writing.set()
            await held.wait()
        await cable.send(data)

    writer = FairWriter(send, parts=True)
    first = asyncio.ensure_future(writer.write(b"s1"))
    await writing.wait()
    later = [
        asyncio.ensure_future(writer.write(frame)) for frame in [text(3 * PART_BYTES, "a").encode(), b"s2"]
    ]
    held.set()
    await asyncio.gather(first, *later)
    assert cable.written == ["s1", "s2", "a", "a", "a"]


async def test_at_most_partial_frames_large_frames_are_written_at_once() -> None:
    count = PARTIAL_FRAMES + 1
    names = {b"#%d" % n: f"f{n}" for n in range(1, count + 1)}
    cable = Cable(names)
    writer = FairWriter(cable.send, parts=True)
    await asyncio.gather(*(writer.write(text(2 * PART_BYTES).encode()) for _ in range(count)))
    order = cable.written
    # The last frame's first part waits for the first frame's last.
    assert order.index(f"f{count}") > len(order) - order[::-1].index("f1") - 1
    assert sorted(order) == sorted([*names.values()] * 2)


async def test_a_frame_whose_writer_gave_up_is_dropped_before_it_starts_and_finished_after() -> None:
    writing, held = asyncio.Event(), asyncio.Event()
    written: list[bytes] = []

    async def send(data: bytes) -> None:
        writing.set()
        await held.wait()
        written.append(data)

    writer = FairWriter(send, parts=True)
    started = asyncio.ensure_future(writer.write(text(2 * PART_BYTES).encode()))
    await writing.wait()
    not_started = asyncio.ensure_future(writer.write(b"never"))
    await asyncio.sleep(0)
    started.cancel()
    not_started.cancel()
    held.set()
    await asyncio.wait([started, not_started])
    await writer.write(b"after")
    assert [data[:1] for data in written] == [b"\x00", b"\x00", b"a"]
    assert written[-1] == b"after"


async def test_closing_the_writer_fails_what_is_not_written() -> None:
    writing = asyncio.Event()

    async def never(data: bytes) -> None:
        writing.set()
        await asyncio.Event().wait()

    writer = FairWriter(never, parts=True)
    writes = [asyncio.ensure_future(writer.write(text(3 * PART_BYTES).encode()))]
    await writing.wait()
    writes.append(asyncio.ensure_future(writer.write(b"small")))
    await asyncio.sleep(0)
    await writer.close("the link closed")
    # The large frame's first part was being written; nothing of the small one, nor of a later one.
    unsent = []
    for write in writes:
        with pytest.raises(LinkClosed, match="the link closed") as closed:
            await write
        unsent.append(closed.value.unsent)
    with pytest.raises(LinkClosed, match="the link closed") as closed:
        await writer.write(b"later")
    assert [*unsent, closed.value.unsent] == [False, True, True]


async def test_to_a_peer_that_does_not_read_parts_every_frame_goes_whole_in_order() -> None:
    frames = [text(3 * PART_BYTES, "a").encode(), b"s1", text(2 * PART_BYTES, "b").encode()]
    cable = Cable({frame: name for frame, name in zip(frames, ["a", "s1", "b"], strict=True)})
    writer = FairWriter(cable.send, parts=False)
    await asyncio.gather(*(writer.write(frame) for frame in frames))
    assert cable.written == ["a", "s1", "b"]


@pytest.mark.parametrize("towards", ["site", "opener"])
async def test_frames_around_a_part_and_of_megabytes_arrive_whole(towards: str) -> None:
    async with link_pair() as pair:
        sender, reader, end = (
            (pair.opener, pair.at_site, SITE) if towards == "site" else (pair.site, pair.at_opener, OPENER)
        )
        expected: list[tuple[object, ...]] = []
        part_id = 0
        for frame_id, size in enumerate(FRAME_SIZES, start=1):
            envelope = text(size - SEND_WRAPPING - MESSAGE_WRAPPING, f"{frame_id}:")
            assert await sender.send([message(envelope)], TIMEOUT_S) == [Result(200)]
            assert pair.answered[-1] == (end, envelope)
            if size <= PART_BYTES:
                expected.append(("send", frame_id, size))
            else:
                part_id += 1
                expected += expected_parts(part_id, size)
        assert [what for what in reader.received if what[0] != "ack"] == expected


async def test_an_ack_larger_than_a_part_comes_in_parts() -> None:
    async with link_pair() as pair:
        results = await pair.opener.send([message(LONG_REFUSAL + "a"), message("b")], TIMEOUT_S)
        assert results == [Result(400, "x" * REFUSAL_CHARS), Result(200)]
        parts = [what for what in pair.at_opener.received if what[0] == "part"]
        assert len(parts) == math.ceil(sum(what[4] for what in parts) / PART_BYTES) >= 3
        assert parts[0][2] and parts[-1][3]


async def test_large_frames_both_ways_at_once_keep_their_parts_apart() -> None:
    async with link_pair() as pair:
        there, back = text(2 * MIB, "there:"), text(2 * MIB + 1, "back:")
        results = await asyncio.gather(
            pair.opener.send([message(there)], TIMEOUT_S), pair.site.send([message(back)], TIMEOUT_S)
        )
        assert list(results) == [[Result(200)], [Result(200)]]
        assert sorted(pair.answered) == sorted([(SITE, there), (OPENER, back)])
        # Each end numbers the parts it writes: part id 1 goes both ways, and means a frame of the writer's.
        assert {what[1] for what in pair.at_site.received if what[0] == "part"} == {1}
        assert {what[1] for what in pair.at_opener.received if what[0] == "part"} == {1}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_small_frame_goes_between_the_parts_of_a_large_one(loop: str) -> None:
    run_on(loop, small_frame_between_parts())


async def small_frame_between_parts() -> None:
    async with link_pair() as pair:
        pair.at_opener.hold = asyncio.Event()
        big = asyncio.ensure_future(pair.opener.send([message(text(3 * MIB, "big:"))], TIMEOUT_S))
        await pair.until(lambda: len(pair.at_opener.sent) == 1, "the large frame's first part")
        queued = asyncio.Event()

        async def send_small() -> list[Result]:
            # send() queues the frame before it first waits.
            queued.set()
            return await pair.opener.send([message("small")], TIMEOUT_S)

        small = asyncio.ensure_future(send_small())
        await queued.wait()
        finished: list[str] = []
        big.add_done_callback(lambda _: finished.append("big"))
        small.add_done_callback(lambda _: finished.append("small"))
        pair.at_opener.hold.set()
        assert await small == [Result(200)]
        assert await big == [Result(200)]
        sent = pair.at_opener.sent
        # The part that was being written, then the small frame, then the rest of the large one.
        assert sent[0][:4] == ("part", 1, True, False)
        assert sent[1][:4] == ("part", 1, False, False)
        assert sent[2][:2] == ("send", 2)
        assert all(what[0] == "part" for what in sent[3:])
        assert [envelope[:5] for _, envelope in pair.answered] == ["small", "big:a"]
        assert finished == ["small", "big"]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_ack_goes_between_the_parts_of_a_large_frame(loop: str) -> None:
    run_on(loop, ack_between_parts())


async def ack_between_parts() -> None:
    async with link_pair() as pair:
        pair.at_site.hold = asyncio.Event()
        big = asyncio.ensure_future(pair.site.send([message(text(3 * MIB, "big:"))], TIMEOUT_S))
        await pair.until(lambda: len(pair.at_site.sent) == 1, "the large frame's first part")
        small = asyncio.ensure_future(pair.opener.send([message("small")], TIMEOUT_S))
        await pair.until(lambda: (SITE, "small") in pair.answered, "the site's answer to the small frame")
        pair.at_site.hold.set()
        assert await small == [Result(200)]
        assert await big == [Result(200)]
        sent = [what[0] for what in pair.at_site.sent]
        assert sent.index("ack") == 2
        received = [what[:2] for what in pair.at_opener.received]
        assert received.index(("ack", 1)) < len(received) - 1
        assert pair.at_opener.received[-1][:4] == ("part", 1, False, True)


async def test_frames_behind_an_ack_waiting_for_its_turn_are_answered_meanwhile() -> None:
    async with link_pair() as pair:
        pair.at_site.hold = asyncio.Event()
        big = asyncio.ensure_future(pair.site.send([message(text(3 * MIB, "big:"))], TIMEOUT_S))
        await pair.until(lambda: len(pair.at_site.sent) == 1, "the large frame's first part")
        # The site's writer waits to write the large frame's second part: each ack waits for its turn.
        smalls = [asyncio.ensure_future(pair.opener.send([message(f"small-{n}")], TIMEOUT_S)) for n in (1, 2)]
        await pair.until(
            lambda: {(SITE, "small-1"), (SITE, "small-2")} <= set(pair.answered), "both small frames answered"
        )
        assert not any(small.done() for small in smalls)
        pair.at_site.hold.set()
        assert [await small for small in smalls] == [[Result(200)], [Result(200)]]
        assert await big == [Result(200)]


async def test_messages_of_a_frame_not_written_when_its_link_broke_were_not_tried() -> None:
    async with link_pair() as pair:
        pair.at_opener.hold = asyncio.Event()
        big = asyncio.ensure_future(
            send_envelopes(pair.opener, [("/zbus-remote", orjson.dumps(text(3 * MIB, "big:")))], TIMEOUT_S)
        )
        await pair.until(lambda: len(pair.at_opener.sent) == 1, "the large frame's first part")
        # Queued behind the large frame's next part, which the writer is held writing.
        small = asyncio.ensure_future(send_envelopes(pair.opener, [("/zbus-remote", b'"small"')], TIMEOUT_S))
        await asyncio.sleep(0)
        await pair.opener.close("cut")
        [big_error], [small_error] = await big, await small
        assert big_error is not None and small_error is not None
        assert "the link to twin 2 broke: cut" == big_error.cause == small_error.cause
        assert (big_error.attempted, small_error.attempted) == (True, False)


async def test_a_frame_is_told_written_before_its_answer_comes() -> None:
    async with link_pair() as pair:
        # The site's answer is a long refusal: its ack goes in parts, held after the first.
        pair.at_site.hold = asyncio.Event()
        written = asyncio.Event()
        envelope = f"{LONG_REFUSAL}small"
        sent = asyncio.ensure_future(pair.opener.send([message(envelope)], TIMEOUT_S, written))
        await asyncio.wait_for(written.wait(), TIMEOUT_S)
        await pair.until(lambda: len(pair.at_site.sent) == 1, "the ack's first part")
        assert (SITE, envelope) in pair.answered
        assert not sent.done()
        pair.at_site.hold.set()
        assert await sent == [Result(400, "x" * REFUSAL_CHARS)]


async def test_an_end_whose_peer_does_not_read_parts_writes_it_whole_frames() -> None:
    async with link_pair(opener_reads_parts=False) as pair:
        there, back = text(MIB, "there:"), text(MIB, "back:")
        assert await pair.site.send([message(back)], TIMEOUT_S) == [Result(200)]
        assert await pair.opener.send([message(there)], TIMEOUT_S) == [Result(200)]
        assert pair.answered == [(OPENER, back), (SITE, there)]
        assert [what[0] for what in pair.at_opener.received] == ["send", "ack"]
        assert {what[0] for what in pair.at_site.received} == {"part", "ack"}


BAD_ON_A_LINK = {
    "garbage": (b"\x00garbage and more", UNREADABLE, "unreadable part: a part with the header 0067"),
    "a continuation of nothing": (header(2, 9) + b"x", UNREADABLE, "frame 9, whose first part did not come"),
    "too big": (
        header(1, 1) + b"x" * (PART_BYTES + 5000),
        TOO_BIG,
        "unreadable part: a frame in parts larger",
    ),
}


@pytest.mark.parametrize("case", BAD_ON_A_LINK)
async def test_a_bad_part_closes_its_link_with_why_and_the_site_serves_on(case: str) -> None:
    bad, code, why = BAD_ON_A_LINK[case]
    async with serving_site(max_bytes=PART_BYTES) as site:
        async with site.link() as pair:
            await pair.opener_socket.send(bad)
            await asyncio.wait_for(asyncio.shield(pair.reading), TIMEOUT_S)
            assert pair.site.closed_reason is not None and why in pair.site.closed_reason
            assert pair.opener.closed_reason == f"closed by the peer ({code} {pair.site.closed_reason[:120]})"
        async with site.link() as pair:
            assert await pair.opener.send([message(text(PART_BYTES))], TIMEOUT_S) == [Result(200)]


async def test_too_many_frames_in_parts_at_once_close_the_link() -> None:
    async with link_pair() as pair:
        for part_id in range(1, PARTIAL_FRAMES + 2):
            await pair.opener_socket.send(header(1, part_id) + b"x")
        await asyncio.wait_for(asyncio.shield(pair.reading), TIMEOUT_S)
        assert (
            pair.site.closed_reason == f"unreadable part: more than {PARTIAL_FRAMES} frames in parts at once"
        )
