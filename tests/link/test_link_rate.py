"""A link's writer measures its cable's rate while busy and sizes the parts of large frames to it: a part
about as long on a slow cable as on a fast one, and what the kernel holds unsent with it."""

from __future__ import annotations

import pytest

from msgbusd.link.link_parts import PART_BYTES
from msgbusd.link.link_rate import MEASURE_S, MIN_PART_BYTES, PART_S, LinkRate
from msgbusd.link.link_writer import FairWriter

pytestmark = pytest.mark.timeout(30)

KBIT = 1000 // 8


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def busy_at(rate: LinkRate, clock: Clock, bytes_per_s: float, seconds: float, piece: int = 1000) -> None:
    rate.busy()
    for _ in range(int(seconds * bytes_per_s / piece)):
        clock.now += piece / bytes_per_s
        rate.wrote(piece)


@pytest.mark.parametrize(
    ("bytes_per_s", "part_bytes"),
    [
        (2000 * KBIT, int(2000 * KBIT * PART_S)),
        (512 * KBIT, MIN_PART_BYTES),
        (100_000 * KBIT, PART_BYTES),
    ],
)
def test_parts_are_sized_to_the_rate_measured(bytes_per_s: float, part_bytes: int) -> None:
    clock = Clock()
    rate = LinkRate(clock)
    assert rate.part_bytes == PART_BYTES
    busy_at(rate, clock, bytes_per_s, 3 * MEASURE_S)
    assert rate.bytes_per_s == pytest.approx(bytes_per_s, rel=0.05)
    assert rate.part_bytes == pytest.approx(part_bytes, rel=0.05)


def test_what_is_written_between_idle_times_is_no_measure() -> None:
    clock = Clock()
    rate = LinkRate(clock)
    # Short stretches, and the quiet time between them: the cable was not what the writer waited for.
    for _ in range(10):
        busy_at(rate, clock, 10 * KBIT, MEASURE_S / 2)
        rate.idle()
        clock.now += 5
    assert rate.bytes_per_s is None
    assert rate.part_bytes == PART_BYTES


def test_a_cable_that_gets_faster_gets_larger_parts_again() -> None:
    clock = Clock()
    rate = LinkRate(clock)
    busy_at(rate, clock, 256 * KBIT, 2.0)
    slow = rate.part_bytes
    rate.idle()
    busy_at(rate, clock, 2000 * KBIT, 2.0)
    assert slow < rate.part_bytes == pytest.approx(2000 * KBIT * PART_S, rel=0.05)


async def test_the_writer_cuts_parts_to_the_cable_and_limits_what_the_kernel_holds() -> None:
    clock = Clock()
    bytes_per_s = 1000 * KBIT
    written: list[bytes] = []
    limits: list[int] = []

    async def send(data: bytes) -> None:
        clock.now += len(data) / bytes_per_s
        written.append(data)

    writer = FairWriter(send, parts=True, limit_unsent=limits.append, rate=LinkRate(clock))
    frame = bytes(range(256)) * 2048
    await writer.write(frame)
    expected = int(bytes_per_s * PART_S)
    assert limits == [pytest.approx(expected, rel=0.05)]
    sizes = [len(piece) - 10 for piece in written]
    assert sizes[0] == PART_BYTES
    assert sizes[-2] == limits[0]
    # The parts put together are the frame.
    assert b"".join(piece[10:] for piece in written) == frame
    # The next large frame is cut to the rate from its first part.
    written.clear()
    await writer.write(frame)
    assert len(written[0]) - 10 == limits[0]
