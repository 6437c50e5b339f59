"""The one writer of a link (:mod:`msgbusd.link.open_link`): it decides what goes on the cable next, so that
a large frame cannot hold up the small ones behind it.

Small frames (acks, small sends) go first, first come first written: every small frame waiting is written
before the next part of a large one, so a small frame waits for at most the one part being written, however
many large frames, parts or small frames are queued. The large frames, cut into parts
(:mod:`msgbusd.link.link_parts`), share what is left in turns, a part each. A part is as long on the
cable whatever its rate (:mod:`msgbusd.link.link_rate`: the writer measures the rate while it is busy),
and the next part is written only once the kernel holds less than a part unsent (``unsent``: a socket takes
whatever its buffer has room for, megabytes on a thin cable, which a small frame written after would wait
behind; ``limit_unsent`` is told the part size). At most
:data:`~msgbusd.link.link_parts.PARTIAL_FRAMES` large frames are written at once; the next ones wait for
one of them to end. To a peer that does not read parts every frame is small: written whole, in order.

A small frame written while nothing else waits is written at once by its caller (no turn, no task): a quiet
link costs what a plain write does. A frame is written completely or not at all: one whose caller gave up
is dropped if nothing of it was written yet, and finished otherwise (the peer's reader would hold its first
parts until the link ends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from msgbusd.link.link_parts import PART_BYTES, PARTIAL_FRAMES, part
from msgbusd.link.link_rate import LinkRate
from msgbusd.link.link_sockets import LinkClosed

# While the kernel holds more than a part unsent, the writer looks again after the time its excess takes
# on the cable, within this (and a fifth of it).
UNSENT_LOOK_S = 0.01


class _Frame:
    """A frame waiting to be written, whole (``part_id`` None) or in parts, and its caller's future."""

    def __init__(self, data: bytes, part_id: int | None, written: asyncio.Future[None]) -> None:
        self.data = data
        self.part_id = part_id
        self.written = written
        # Where the next part starts (a whole frame: 0 until it is written).
        self.offset = 0

    @property
    def started(self) -> bool:
        return self.offset > 0

    @property
    def finished(self) -> bool:
        return self.offset >= len(self.data)

    def next_piece(self, part_bytes: int) -> bytes:
        if self.part_id is None:
            self.offset = len(self.data)
            return self.data
        piece = part(self.part_id, self.data, self.offset, part_bytes)
        self.offset += part_bytes
        return piece


class FairWriter:
    """Writes frames with ``send`` (one WebSocket message a call), small ones first; ``parts``: the peer
    reads parts, so frames larger than a part are written in parts. ``limit_unsent`` is told the part size
    whenever it changes: what the kernel below may hold unsent."""

    def __init__(
        self,
        send: Callable[[bytes], Awaitable[None]],
        *,
        parts: bool,
        limit_unsent: Callable[[int], None] | None = None,
        unsent: Callable[[], int | None] | None = None,
        rate: LinkRate | None = None,
    ) -> None:
        self._send = send
        self._parts = parts
        self._limit_unsent = limit_unsent
        self._unsent = unsent
        self.rate = rate or LinkRate()
        self._part_bytes = PART_BYTES
        self._next_part_id = 1
        # Lists rather than deques here: they stay short, and an empty one costs a tenth (a cloud site
        # keeps thousands of quiet links).
        self._smalls: list[_Frame] = []
        # The large frames being written, in turn order, and those waiting for one of them to end.
        self._large: list[_Frame] = []
        self._waiting_large: list[_Frame] = []
        # The frame a piece of which is being written.
        self._writing: _Frame | None = None
        self._task: asyncio.Task[None] | None = None
        # A frame is being written by its caller directly (nothing else was waiting).
        self._direct = False
        self._closed: str | None = None

    @property
    def busy(self) -> bool:
        """A frame is being written: another one waits its turn."""
        return self._task is not None or self._direct

    async def write(self, frame: bytes) -> None:
        """Write ``frame``; returns once its last piece is written. Raises :class:`LinkClosed` if the link
        closes first. The frame is queued before this first waits."""
        if self._closed is not None:
            raise LinkClosed(self._closed, unsent=True)
        in_parts = self._parts and len(frame) > PART_BYTES
        if not in_parts and self._task is None and not self._direct:
            await self._write_at_once(frame)
            return
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if in_parts:
            large = _Frame(frame, self._next_part_id, written)
            self._next_part_id += 1
            if len(self._large) < PARTIAL_FRAMES:
                self._large.append(large)
            else:
                self._waiting_large.append(large)
        else:
            self._smalls.append(_Frame(frame, None, written))
        if self._task is None and not self._direct:
            self._task = asyncio.ensure_future(self._write_in_turns())
        await written

    async def _write_at_once(self, frame: bytes) -> None:
        """A small frame while nothing else waits (a quiet link, the common case): written by its caller,
        without a turn; what is queued meanwhile is written in turns after it."""
        self._direct = True
        try:
            await self._send(frame)
        except LinkClosed as exc:
            self._closed = self._closed or str(exc)
            self._fail_all()
            raise
        finally:
            self._direct = False
            if (self._smalls or self._large) and self._task is None and self._closed is None:
                self._task = asyncio.ensure_future(self._write_in_turns())

    async def close(self, reason: str) -> None:
        """Stop writing; every frame not completely written fails with :class:`LinkClosed`."""
        if self._closed is None:
            self._closed = reason
        self._fail_all()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Not awaited directly: a cancellation of the caller's own is not to be taken for the task's.
            await asyncio.wait([task])

    async def _write_in_turns(self) -> None:
        rate = self.rate
        rate.busy()
        try:
            while (frame := self._next_frame()) is not None:
                if frame.part_id is not None and await self._kernel_holds_a_part():
                    # What waits below goes first; small frames queued meanwhile go before this part.
                    continue
                self._writing = frame
                piece = frame.next_piece(self._part_bytes)
                await self._send(piece)
                self._writing = None
                rate.wrote(len(piece))
                if frame.finished:
                    if not frame.written.done():
                        frame.written.set_result(None)
                    if frame.part_id is None:
                        self._smalls.pop(0)
                    else:
                        self._large_ended(frame)
                elif frame.part_id is not None:
                    # The large frames take turns: this one goes behind the others.
                    self._large.remove(frame)
                    self._large.append(frame)
                self._follow_rate()
                # Lets the link's other tasks queue their frames (and the loop read) between pieces.
                await asyncio.sleep(0)
        except LinkClosed as exc:
            self._closed = self._closed or str(exc)
            self._fail_all()
        except Exception as exc:
            self._closed = self._closed or f"writing failed: {exc}"
            self._fail_all()
        finally:
            rate.idle()
            if self._task is asyncio.current_task():
                self._task = None

    def _next_frame(self) -> _Frame | None:
        """The frame to write a piece of: the first small frame waiting, else the large frame whose turn it
        is. Frames whose caller gave up before any of them was written are dropped."""
        smalls = self._smalls
        while smalls:
            if not smalls[0].written.done():
                return smalls[0]
            smalls.pop(0)
        while self._large:
            large = self._large[0]
            if large.started or not large.written.done():
                return large
            self._large_ended(large)
        return None

    def _large_ended(self, frame: _Frame) -> None:
        self._large.remove(frame)
        if self._waiting_large:
            self._large.append(self._waiting_large.pop(0))

    async def _kernel_holds_a_part(self) -> bool:
        """Whether the kernel holds more than a part unsent; if so, wait about as long as it takes to send
        the excess (a small frame written meanwhile waits behind a part at most)."""
        held = self._unsent() if self._unsent is not None else None
        if held is None or held <= self._part_bytes:
            return False
        bytes_per_s = self.rate.bytes_per_s
        wait_s = (held - self._part_bytes) / bytes_per_s if bytes_per_s else UNSENT_LOOK_S
        await asyncio.sleep(min(max(wait_s, UNSENT_LOOK_S / 5), UNSENT_LOOK_S))
        return True

    def _follow_rate(self) -> None:
        """Size the parts to the cable's rate as measured, and what the kernel holds unsent with them."""
        part_bytes = self.rate.part_bytes
        if part_bytes != self._part_bytes:
            self._part_bytes = part_bytes
            if self._limit_unsent is not None:
                self._limit_unsent(part_bytes)

    def _fail_all(self) -> None:
        frames = [*self._smalls, *self._large, *self._waiting_large]
        if self._writing is not None and self._writing not in frames:
            frames.append(self._writing)
        self._writing = None
        self._smalls.clear()
        self._large.clear()
        self._waiting_large.clear()
        for frame in frames:
            if not frame.written.done():
                frame.written.set_exception(LinkClosed(self._closed or "closed", unsent=not frame.started))
