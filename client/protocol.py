"""What the sync and async clients share: defaults, building a request, and matching replies to destinations.

No I/O here; :mod:`client.sync` and :mod:`client.aio` do the Redis calls.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence

from client.errors import CallTimeout
from client.replies import Reply, decode_envelope
from msgbusd.envelope import PROTOCOL_VERSION, Envelope, encode_payload
from msgbusd.errors import invalid_message_text

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
# What the daemon uses when a request says exp = 0.
DEFAULT_EXP_S = 3600
DEFAULT_RETRIES = 2
# Waiting a little past the request's lifetime lets the daemon's own expiry error arrive before we give up.
EXPIRY_GRACE_S = 10.0
# redis-py cuts any read longer than its socket timeout (5 s by default), so long waits are chunked.
POP_CHUNK_S = 1.0
# Redis reads a blocking pop timeout of 0 as "forever": never round a short remainder down to it.
MIN_POP_S = 0.01

_INVALID_MESSAGE_PREFIX = invalid_message_text("")

log = logging.getLogger(__name__)


def destinations(dst: int | Sequence[int]) -> tuple[int, ...]:
    """Normalise ``dst`` to a non-empty tuple of twin ids (``ValueError``/``TypeError`` otherwise)."""
    twins = (dst,) if isinstance(dst, int) else tuple(dst)
    if not twins:
        raise ValueError("at least one destination twin is needed")
    for twin in twins:
        if isinstance(twin, bool) or not isinstance(twin, int):
            raise TypeError(f"a destination twin id must be an int, got {twin!r}")
        if twin <= 0:
            raise ValueError(f"a destination twin id must be positive, got {twin}")
    return twins


def build_request(
    dst: int | Sequence[int], cmd: str, data: bytes | str, *, exp: int, retries: int, ret: str | None = None
) -> Envelope:
    """The envelope a local client pushes to ``msgbus.system.local``; ``ret`` defaults to a fresh uuid4."""
    if not cmd:
        raise ValueError("the command must not be empty")
    if exp < 0:
        raise ValueError(f"exp must be >= 0 seconds, got {exp}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    payload = data.encode() if isinstance(data, str) else bytes(data)
    return Envelope(
        ver=PROTOCOL_VERSION,
        uid="",
        cmd=cmd,
        exp=exp,
        retries=retries,
        dat=encode_payload(payload),
        src=0,
        dst=destinations(dst),
        ret=ret or str(uuid.uuid4()),
        now=int(time.time()),
    )


def call_timeout(timeout: float | None, exp: int) -> float:
    """Seconds to wait for replies: ``timeout`` if given, else the request's lifetime plus a grace period."""
    if timeout is None:
        return (exp or DEFAULT_EXP_S) + EXPIRY_GRACE_S
    return wait_timeout(timeout)


def wait_timeout(timeout: float | None) -> float:
    """Seconds ``wait`` blocks: ``timeout`` if given (``math.inf``: no limit), else the default lifetime."""
    if timeout is None:
        return DEFAULT_EXP_S + EXPIRY_GRACE_S
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
    return timeout


def pop_chunk(socket_timeout: float | None, wanted: float = POP_CHUNK_S) -> float:
    """``wanted``, shortened to what a connection with this socket timeout lets a blocking pop take."""
    if not socket_timeout:
        return wanted
    return max(MIN_POP_S, min(wanted, socket_timeout / 2))


class Deadline:
    """A monotonic deadline that hands out blocking-pop chunks of at most ``chunk`` seconds."""

    def __init__(self, seconds: float, chunk: float = POP_CHUNK_S) -> None:
        self.seconds = seconds
        self._chunk = chunk
        self._end = time.monotonic() + seconds

    def next_chunk(self) -> float | None:
        """Seconds for the next blocking pop, or None once the deadline has passed."""
        remaining = self._end - time.monotonic()
        if remaining <= 0:
            return None
        return max(MIN_POP_S, min(self._chunk, remaining))


class ReplyCollector:
    """Matches replies popped from one return queue to the destinations of a request.

    With ``dst`` the replies come out in the order of ``dst``; without it (``wait``) ``count`` replies are
    collected in arrival order.
    """

    def __init__(self, ret: str, *, dst: Sequence[int] | None = None, count: int = 1) -> None:
        if dst is None and count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.ret = ret
        self._dst = tuple(dst) if dst is not None else None
        self._expected = len(self._dst) if self._dst is not None else count
        self._slots: list[Reply | None] = [None] * self._expected
        self._arrived = 0

    @property
    def done(self) -> bool:
        return all(slot is not None for slot in self._slots)

    def add(self, raw: bytes | str) -> None:
        """Take one popped item; raises :class:`ProtocolError` if it cannot be decoded."""
        envelope = decode_envelope(raw)
        if self._dst is None:
            self._slots[self._arrived] = Reply.from_envelope(envelope)
            self._arrived += 1
            return
        if envelope.err.startswith(_INVALID_MESSAGE_PREFIX):
            # The daemon rejects a malformed request once, for all its destinations.
            for index in self._empty_slots():
                self._slots[index] = Reply.from_envelope(envelope, src=self._dst[index])
            return
        slot = self._match(envelope)
        if slot is not None:
            self._slots[slot] = Reply.from_envelope(envelope, src=self._dst[slot])

    def replies(self) -> list[Reply]:
        """The replies collected so far, in destination (or arrival) order."""
        return [slot for slot in self._slots if slot is not None]

    def timeout(self, seconds: float) -> CallTimeout:
        """The error for giving up now."""
        missing: tuple[int, ...] = ()
        if self._dst is not None:
            missing = tuple(self._dst[index] for index in self._empty_slots())
        return CallTimeout(self.ret, seconds, self._expected, self.replies(), missing)

    def _empty_slots(self) -> list[int]:
        return [index for index, slot in enumerate(self._slots) if slot is None]

    def _match(self, envelope: Envelope) -> int | None:
        """The slot a reply fills, or None when every slot is already filled."""
        assert self._dst is not None
        empty = self._empty_slots()
        by_src = [i for i in empty if self._dst[i] == envelope.src]
        by_uid = [i for i in empty if self._dst[i] == _uid_twin(envelope.uid)]
        # A service's reply comes from its twin; a daemon's error names the destination in the uid.
        candidates = by_uid + by_src if envelope.err else by_src + by_uid
        if candidates:
            return candidates[0]
        if not empty:
            log.warning(
                "ignoring an extra reply on %s (src %s, uid %r)", self.ret, envelope.src, envelope.uid
            )
            return None
        # A reply we cannot attribute (e.g. a daemon error without the twin) still ends someone's wait.
        return empty[0]


def _uid_twin(uid: str) -> int | None:
    """The twin of a daemon uid ``"<dst>.<n>"``, or None."""
    twin, dot, _ = uid.partition(".")
    return int(twin) if dot and twin.isdigit() else None
