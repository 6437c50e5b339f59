"""Frames written in parts: how a link (:mod:`msgbusd.link.links`) cuts a large frame into binary
WebSocket messages, and how the other end puts it together again.

A frame larger than :data:`PART_BYTES` goes to a peer that reads parts as parts, each a binary message::

    byte 0       0x00: a JSON frame never starts with it
    byte 1       flags: 1 the frame's first part, 2 its last (3: both)
    bytes 2-9    the part id, big-endian: a counter of the writer's own, per link, so that the ids of one
                 direction never meet those of the other (both ends number their ``send`` frames on their
                 own, and an ``ack`` may be written in parts too)
    the rest     the frame's next slice, at least one byte

The parts of several frames interleave (that is the point: a small frame waits for a part, not for a whole
frame); the slices of one frame come in order. A writer has at most :data:`PARTIAL_FRAMES` frames in parts
at once, and a reader holds no more, each no larger than the link's limit: a peer that goes beyond either,
or writes a part that cannot be read, has its link closed with the reason.
"""

from __future__ import annotations

import struct

# The most a part carries (less on a slow cable: link_rate), and the largest frame written whole: a small
# frame written after a large one waits for about one part.
PART_BYTES = 16 * 1024
# Frames a writer has in parts at once (the others wait for one of them to end), and a reader holds.
PARTIAL_FRAMES = 8
# The close code of a link whose peer wrote a part that cannot be read, and of one whose frame is too big.
UNREADABLE = 1003
TOO_BIG = 1009

FIRST = 0x01
LAST = 0x02
_MARK = 0x00
_HEADER = struct.Struct(">BBQ")


class PartError(ValueError):
    """A part that cannot be taken; ``code`` is the close code for the link it came on."""

    def __init__(self, reason: str, code: int = UNREADABLE) -> None:
        super().__init__(reason)
        self.code = code


def is_part(data: bytes) -> bool:
    """Whether a message is a part rather than a whole JSON frame."""
    return data[:1] == b"\x00"


def part(part_id: int, frame: bytes, start: int, size: int = PART_BYTES) -> bytes:
    """The part of ``frame`` (id ``part_id``) whose slice begins at ``start``, ``size`` bytes at most."""
    end = start + size
    flags = (FIRST if start == 0 else 0) | (LAST if end >= len(frame) else 0)
    return _HEADER.pack(_MARK, flags, part_id) + memoryview(frame)[start:end]


class Reassembly:
    """The frames a link's reader has part of: at most ``max_frames`` at once, each ``max_frame_bytes``
    at most."""

    def __init__(self, max_frame_bytes: int, max_frames: int = PARTIAL_FRAMES) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._max_frames = max_frames
        self._partial: dict[int, bytearray] = {}

    @property
    def holding(self) -> bool:
        """Some frame has come in part."""
        return bool(self._partial)

    def add(self, data: bytes) -> bytes | None:
        """Take one part; the whole frame once this was its last part, else None. Raises
        :class:`PartError` for a part that cannot be taken (the link is to be closed)."""
        if len(data) <= _HEADER.size:
            raise PartError(f"a part of {len(data)} bytes carries nothing")
        mark, flags, part_id = _HEADER.unpack_from(data)
        if mark != _MARK or flags & ~(FIRST | LAST):
            raise PartError(f"a part with the header {bytes(data[:2]).hex()}")
        if flags & FIRST:
            if part_id in self._partial:
                raise PartError(f"part id {part_id} started again before its last part")
            if len(self._partial) >= self._max_frames:
                raise PartError(f"more than {self._max_frames} frames in parts at once")
            held = self._partial[part_id] = bytearray()
        else:
            found = self._partial.get(part_id)
            if found is None:
                raise PartError(f"a part of frame {part_id}, whose first part did not come")
            held = found
        if len(held) + len(data) - _HEADER.size > self._max_frame_bytes:
            del self._partial[part_id]
            raise PartError(f"a frame in parts larger than {self._max_frame_bytes} bytes", TOO_BIG)
        held += memoryview(data)[_HEADER.size :]
        if not flags & LAST:
            return None
        del self._partial[part_id]
        return bytes(held)
