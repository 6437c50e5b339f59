"""How fast a link's cable takes what its writer (:mod:`msgbusd.link.link_writer`) writes, and the part
size that follows from it.

A small frame written while a large one goes in parts waits for the part being written and what the
buffers below hold (:mod:`msgbusd.link.link_pacing`). A fixed part is 65 ms on a 2 Mbit/s cable and a
quarter of a second on 512 kbit/s; a part as long on every cable, :data:`PART_S`, keeps the small frame's
wait the same whatever the cable. The rate is measured by the writer itself: while it has pieces waiting,
each write returns once the kernel took it, and the kernel takes what the cable sends (it holds little
unsent), so bytes over time while busy is the cable's rate. A fast cable (loopback, a LAN) measures faster
than any part needs: its parts stay at :data:`~msgbusd.link.link_parts.PART_BYTES`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from msgbusd.link.link_parts import PART_BYTES

# How long a part takes on the cable, about.
PART_S = 0.05
# The smallest part: below it each part costs its header and a turn of the event loop for little (and the
# opener's WebSocket library waits for the transport only after this much: link_pacing).
MIN_PART_BYTES = 4 * 1024
# A rate is taken over this long of busy writing at least (a part or two tell little on a cable whose
# queues take the first ones at once).
MEASURE_S = 0.25
# The weight of a new measure against the rate known so far.
NEW_WEIGHT = 0.5


class LinkRate:
    """The cable's rate as measured over the writer's busy stretches, and the part size it gives."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Bytes per second, once measured.
        self.bytes_per_s: float | None = None
        self._since: float | None = None
        self._bytes = 0

    @property
    def part_bytes(self) -> int:
        """The part size for this cable: :data:`PART_S` of its rate, within bounds."""
        if self.bytes_per_s is None:
            return PART_BYTES
        return max(MIN_PART_BYTES, min(PART_BYTES, int(self.bytes_per_s * PART_S)))

    def busy(self) -> None:
        """The writer has pieces waiting from now on (a stretch begins unless one is going)."""
        if self._since is None:
            self._since = self._clock()
            self._bytes = 0

    def wrote(self, size: int) -> None:
        """A piece of ``size`` bytes was taken during the stretch."""
        if self._since is None:
            return
        self._bytes += size
        elapsed = self._clock() - self._since
        if elapsed >= MEASURE_S:
            measured = self._bytes / elapsed
            known = self.bytes_per_s
            self.bytes_per_s = measured if known is None else known + NEW_WEIGHT * (measured - known)
            self._since = self._clock()
            self._bytes = 0

    def idle(self) -> None:
        """The writer has nothing waiting: what it does not write is no measure of the cable."""
        self._since = None
        self._bytes = 0
