"""What the sync and async clients share: defaults, building a request, matching replies to destinations, and
the crash-safe way of taking replies from a return queue.

No I/O here; :mod:`client.sync` and :mod:`client.aio` send the commands :class:`ReplyTaker` queues.
"""

from __future__ import annotations

import enum
import logging
import math
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

from client.errors import ClientError, ProtocolError, SiteRedisFull, refused_when_full
from client.replies import CallTimeout, Reply, decode_envelope
from wire import keys
from wire.backoff import Backoff
from wire.envelope import PROTOCOL_VERSION, Envelope, encode_payload
from wire.error_texts import invalid_message_text

if TYPE_CHECKING:
    from redis.asyncio.client import Pipeline as AsyncPipeline
    from redis.client import Pipeline

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
# While Redis is away during a wait: retry soon (a restart takes a moment), then about once a second.
RECONNECT_BACKOFF = Backoff(base_s=0.05, max_s=1.0)

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
        remaining = self.remaining_s()
        if remaining <= 0:
            return None
        return max(MIN_POP_S, min(self._chunk, remaining))

    def remaining_s(self) -> float:
        """Seconds left (0 once the deadline has passed)."""
        return max(0.0, self._end - time.monotonic())


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


class _Round(enum.Enum):
    """What the next round trip of a :class:`ReplyTaker` does."""

    # Read the oldest reply of the taken list that was not handed to the collector yet.
    DRAIN = "drain"
    # Move the next reply from the return list into the taken list (blocking for at most a chunk).
    POP = "pop"
    # Remove from the taken list the replies the caller gets.
    FINISH = "finish"


class ReplyTaker:
    """How one wait takes replies from a return list without losing any, as round trips of Redis commands.

    Each reply is moved (BLMOVE, oldest first) from the return list ``ret`` to its taken list
    (:func:`wire.keys.taken_replies`) and is removed from there only once the caller has it: with the
    wait's result, its :class:`CallTimeout` or its :class:`ProtocolError`. A reply whose move was answered
    while the connection broke, or that a client which then died had moved, is still in the taken list; it
    is taken from there before anything else, at the start of a ``wait`` and after every connection error.
    Each round also asks how long the taken list is, so a move that redis-py repeated on its own after a
    broken connection is noticed, and its reply taken in turn. The taken list gets the return list's TTL at
    every round. One wait per return queue at a time.

    No I/O here: a driver calls :meth:`queue` (the commands of one round trip, on a non-transactional
    pipeline) and :meth:`take` (their answers) until :attr:`finished`, asks :meth:`retry_after` what to do on
    a connection error, then returns :meth:`result`. Normally that is one round trip per reply, and one more
    to remove the replies at the end. ``fresh`` says that ``ret`` was just made for a request that Redis
    took: nothing can have been taken from it yet.

    A full Redis refuses the moves (they write): a driver runs each round trip in :meth:`redis_full`, and the
    wait goes on like one that lost its connection, the replies waiting in Redis until it has room.
    """

    def __init__(
        self, collector: ReplyCollector, seconds: float, chunk: float, *, fresh: bool = False
    ) -> None:
        self._collector = collector
        self._seconds = seconds
        self._deadline = Deadline(seconds, chunk)
        self._ret = collector.ret
        self._taken = keys.taken_replies(collector.ret)
        # The replies handed to the collector, oldest first: they are the right end of the taken list.
        self._held: list[bytes | str] = []
        self._round = _Round.POP if fresh else _Round.DRAIN
        # Redis answered this wait (or took its request) at least once.
        self._reached = fresh
        self._last_pop = False
        self._failure: ClientError | None = None
        self._errors_in_a_row = 0
        self.finished = False

    def queue(self, pipe: Pipeline | AsyncPipeline) -> None:
        """Queue the commands of the next round trip on ``pipe`` (sync or asyncio, without MULTI)."""
        taken = self._taken
        if self._round is _Round.FINISH:
            # The undecodable reply travels in the error; the good ones before it stay for a later wait.
            done = self._held[-1:] if isinstance(self._failure, ProtocolError) else self._held
            for raw in done:
                # By value, from the right: sent again after a lost answer, it removes nothing more.
                # (redis-py's stubs say str; the popped item is sent back unchanged.)
                pipe.lrem(taken, -1, cast(str, raw))
            return
        if self._round is _Round.DRAIN:
            pipe.expire(taken, keys.RETURN_QUEUE_TTL_S)
            pipe.lindex(taken, -1 - len(self._held))
            pipe.llen(taken)
            return
        chunk = self._deadline.next_chunk()
        self._last_pop = chunk is None
        # The daemon LPUSHes replies: moving from the right takes them in arrival order, and pushing onto the
        # left of the taken list keeps the oldest at its right end.
        if chunk is None:
            pipe.lmove(self._ret, taken, "RIGHT", "LEFT")
        else:
            # redis-py's stubs say int; Redis takes decimal seconds.
            pipe.blmove(self._ret, taken, cast(int, chunk), "RIGHT", "LEFT")
        # Queued behind the blocking move, so Redis runs them right after it, in the same round trip.
        pipe.expire(taken, keys.RETURN_QUEUE_TTL_S)
        pipe.llen(taken)

    def redis_full(self) -> AbstractContextManager[None]:
        """Where a driver runs a round trip: Redis's refusal for want of memory becomes
        :class:`SiteRedisFull`, which :meth:`retry_after` takes like a lost connection."""
        return refused_when_full(
            "to hand over replies", f"the replies that arrived stay on {self._ret} for a later wait"
        )

    def take(self, results: Sequence[Any]) -> None:
        """Act on the answers to the commands :meth:`queue` queued last."""
        self._reached = True
        self._errors_in_a_row = 0
        if self._round is _Round.FINISH:
            self.finished = True
        elif self._round is _Round.DRAIN:
            _, oldest, length = results
            if not self._lost(length):
                self._drained(oldest, length)
        else:
            moved, _, length = results
            if not self._lost(length - (moved is not None)):
                self._popped(moved, length)

    def retry_after(self, error: Exception) -> float | None:
        """Seconds to wait before the next round trip after losing the connection with ``error``, or None to
        give up and raise it.

        Replies are safe in Redis meanwhile, so the wait goes on until its deadline; but a wait that Redis
        never answered gives up at once (a wrong URL is better reported than retried).
        """
        if not self._reached:
            return None
        remaining = self._deadline.remaining_s()
        if remaining <= 0:
            if self._round is not _Round.FINISH:
                return None
            log.warning(
                "cannot remove %d handed reply(ies) from the taken list of %s (%s); a later wait on it gets "
                "them again",
                len(self._held),
                self._ret,
                error,
            )
            self.finished = True
            return 0.0
        self._errors_in_a_row += 1
        if self._round is not _Round.FINISH:
            # The lost answer may have been a move: look in the taken list before moving more.
            self._round = _Round.DRAIN
        if isinstance(error, SiteRedisFull):
            log.warning("the site's Redis is full: the replies on %s are taken once it has room", self._ret)
        else:
            log.warning("lost Redis while waiting for replies on %s (%s); retrying", self._ret, error)
        return min(RECONNECT_BACKOFF.delay_s(min(self._errors_in_a_row, 32)), remaining)

    def result(self) -> list[Reply]:
        """The replies, once :attr:`finished`; raises the :class:`CallTimeout` or :class:`ProtocolError`
        met instead."""
        if self._failure is not None:
            raise self._failure
        return self._collector.replies()

    def _drained(self, oldest: bytes | str | None, length: int) -> None:
        if oldest is None:
            self._round = _Round.POP
            return
        self._hand(oldest)
        if self._round is _Round.DRAIN and length <= len(self._held):
            self._round = _Round.POP

    def _popped(self, moved: bytes | str | None, length: int) -> None:
        if moved is not None and length == len(self._held) + 1:
            self._hand(moved)
        elif length > len(self._held):
            # Older replies wait in the taken list (a move redis-py repeated, a lost answer): they go first.
            self._round = _Round.DRAIN
        elif self._last_pop:
            self._fail(self._collector.timeout(self._seconds))

    def _lost(self, length: int) -> bool:
        """Whether the taken list, ``length`` long without what the last round moved, lost handed replies."""
        if length >= len(self._held):
            return False
        # Only an expiry (Redis away for longer than the TTL) takes them away: what is there now is new.
        log.warning(
            "the taken list of %s expired after %d reply(ies) were handed", self._ret, len(self._held)
        )
        self._held.clear()
        self._round = _Round.DRAIN
        return True

    def _hand(self, raw: bytes | str) -> None:
        self._held.append(raw)
        try:
            self._collector.add(raw)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if self._collector.done:
            self._round = _Round.FINISH

    def _fail(self, failure: ClientError) -> None:
        self._failure = failure
        if self._held:
            self._round = _Round.FINISH
        else:
            self.finished = True


def _uid_twin(uid: str) -> int | None:
    """The twin of a daemon uid ``"<dst>.<n>"``, or None."""
    twin, dot, _ = uid.partition(".")
    return int(twin) if dot and twin.isdigit() else None
