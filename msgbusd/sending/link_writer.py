"""The one writer of a link (:mod:`msgbusd.sending.links`): it takes turns between the frames waiting to be
written, so that a large frame cannot hold up the small ones behind it.

Small frames (acks, small sends) are one stream, first come first written; each large frame, cut into parts
(:mod:`msgbusd.sending.link_parts`), is a stream of its own. The writer writes one piece of each stream in
turn, so a small frame waits for at most one part of each large frame being written. At most
:data:`~msgbusd.sending.link_parts.PARTIAL_FRAMES` large frames are written at once; the next ones wait for
one of them to end. To a peer that does not read parts every frame is small: written whole, in order.

A small frame written while nothing else waits is written at once by its caller (no turn, no task): a quiet
link costs what a plain write does. A frame is written completely or not at all: one whose caller gave up
is dropped if nothing of it was written yet, and finished otherwise (the peer's reader would hold its first
parts until the link ends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from msgbusd.sending.link_parts import PART_BYTES, PARTIAL_FRAMES, part
from msgbusd.sending.link_sockets import LinkClosed


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

    def next_piece(self) -> bytes:
        if self.part_id is None:
            self.offset = len(self.data)
            return self.data
        piece = part(self.part_id, self.data, self.offset)
        self.offset += PART_BYTES
        return piece


class _Smalls:
    """The stream of small frames, first come first written."""

    def __init__(self) -> None:
        # Lists rather than deques here: they stay short, and an empty one costs a tenth (a cloud site
        # keeps thousands of quiet links).
        self.frames: list[_Frame] = []


class FairWriter:
    """Writes frames with ``send`` (one WebSocket message a call), taking turns between them; ``parts``:
    the peer reads parts, so frames larger than a part are written in parts."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]], *, parts: bool) -> None:
        self._send = send
        self._parts = parts
        self._next_part_id = 1
        self._smalls = _Smalls()
        # The streams with something to write, in turn order.
        self._turns: list[_Smalls | _Frame] = []
        self._large = 0
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
            if self._large < PARTIAL_FRAMES:
                self._large += 1
                self._turns.append(large)
            else:
                self._waiting_large.append(large)
        else:
            self._smalls.frames.append(_Frame(frame, None, written))
            # Otherwise the stream is in turn already, or being written (it goes back in turn after).
            if len(self._smalls.frames) == 1:
                self._turns.append(self._smalls)
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
            if self._turns and self._task is None and self._closed is None:
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
        try:
            while (turn := self._next_turn()) is not None:
                stream, frame = turn
                self._writing = frame
                await self._send(frame.next_piece())
                self._writing = None
                if frame.finished:
                    if not frame.written.done():
                        frame.written.set_result(None)
                    if stream is frame:
                        self._large_ended()
                    else:
                        self._smalls.frames.pop(0)
                if (stream is frame and not frame.finished) or (stream is not frame and self._smalls.frames):
                    self._turns.append(stream)
                # Lets the link's other tasks queue their frames (and the loop read) between pieces.
                await asyncio.sleep(0)
        except LinkClosed as exc:
            self._closed = self._closed or str(exc)
            self._fail_all()
        except Exception as exc:
            self._closed = self._closed or f"writing failed: {exc}"
            self._fail_all()
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _next_turn(self) -> tuple[_Smalls | _Frame, _Frame] | None:
        """The stream whose turn it is and the frame to write a piece of; frames whose caller gave up before
        any of them was written are dropped."""
        while self._turns:
            stream = self._turns.pop(0)
            if isinstance(stream, _Smalls):
                while stream.frames and stream.frames[0].written.done():
                    stream.frames.pop(0)
                if stream.frames:
                    return stream, stream.frames[0]
            elif stream.started or not stream.written.done():
                return stream, stream
            else:
                self._large_ended()
        return None

    def _large_ended(self) -> None:
        self._large -= 1
        if self._waiting_large:
            self._large += 1
            self._turns.append(self._waiting_large.pop(0))

    def _fail_all(self) -> None:
        frames = [*self._smalls.frames, *self._waiting_large]
        frames += [stream for stream in self._turns if isinstance(stream, _Frame)]
        if self._writing is not None:
            frames.append(self._writing)
            self._writing = None
        self._smalls.frames.clear()
        self._waiting_large.clear()
        self._turns.clear()
        self._large = 0
        for frame in frames:
            if not frame.written.done():
                frame.written.set_exception(LinkClosed(self._closed or "closed", unsent=not frame.started))
