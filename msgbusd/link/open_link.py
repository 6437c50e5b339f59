"""One open link (:mod:`msgbusd.link.links` tells the protocol): this end's frames sent and their acks
awaited, the peer's frames answered in the order they came, pings for the opener's end, and the close.
:func:`send_envelopes` sends signed envelopes over it in as few frames as the peer's size limit allows."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson

from msgbusd.errors import DeliveryError, peer_refusal
from msgbusd.link.batching import batch_message, chunks
from msgbusd.link.link_pacing import Pacing
from msgbusd.link.link_parts import PartError, Reassembly, is_part
from msgbusd.link.link_sockets import RETIRED, LinkClosed, Socket
from msgbusd.link.link_writer import FairWriter
from msgbusd.reports.logs import about
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES, envelope_size_limit
from wire.error_texts import too_large_text

log = logging.getLogger("msgbusd.links")

# Frames received and not yet answered, per link: a sender waits for acks once it has a few frames on their
# way (batch_window.WINDOW), so more means a flood.
INBOUND_FRAMES = 32
# Room in a frame for what wraps its envelopes (the op, the id, each message's path), and in an ack.
FRAME_OVERHEAD_BYTES = 4096

# What an inbound frame's envelopes get: one result per message, {"status": 200} or status and message.
# Called with the twin at the other end, the messages, and whether the link is this site's link to its relay
# (which carries other twins' messages, encrypted for this site).
Answer = Callable[[int, list[Any], bool], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class Result:
    """A peer's answer to one envelope sent over a link."""

    status: int
    message: str = ""
    retry_after_s: float | None = None


class Link:
    """An open link to twin ``peer``: sends frames and waits for their acks, answers the peer's frames in
    the order they came.

    One writer decides what this end writes next (:class:`~msgbusd.link.link_writer.FairWriter`): to a
    peer that reads parts (``peer_reads_parts``: it said so in the handshake) a large frame goes in parts,
    and the small frames written meanwhile go before its next part. The peer's frames in parts are put
    together again, up to ``max_bytes`` (the largest envelope this end takes) and its wrapping each."""

    def __init__(
        self,
        peer: int,
        socket: Socket,
        answer: Answer,
        *,
        opened_here: bool,
        peer_max_bytes: int,
        peer_reads_parts: bool = False,
        max_bytes: int = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES),
        uplink: bool = False,
        to_relay: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.peer = peer
        self.opened_here = opened_here
        # Kept open by the edge end so that the other end can reach it: never closed for being idle.
        self.uplink = uplink
        # This site's link to its relay: what comes on it is from any twin, through the relay.
        self.to_relay = to_relay
        # Set once the link is closed and its reader has ended (made when first asked for).
        self._ended: asyncio.Event | None = None
        self._has_ended = False
        self._clock = clock
        # When a frame last went either way (pings do not count).
        self.used_at = clock()
        # Closed by this site because it was idle, or to make room for another: not a break.
        self.retired = False
        # The largest envelope the peer takes (it says so in the handshake).
        self.peer_max_bytes = peer_max_bytes
        self.peer_reads_parts = peer_reads_parts
        self._socket = socket
        self._answer = answer
        pacing = getattr(socket, "pacing", None)
        self._writer = FairWriter(
            socket.send,
            parts=peer_reads_parts,
            limit_unsent=pacing.limit_unsent if isinstance(pacing, Pacing) else None,
            unsent=pacing.unsent_bytes if isinstance(pacing, Pacing) else None,
        )
        self._parts = Reassembly(max_bytes + FRAME_OVERHEAD_BYTES)
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[list[Result]]] = {}
        # The peer's frames waiting for their answer, in order, and the task answering them while there are
        # some (a quiet link has none); the reader waits for room beyond INBOUND_FRAMES.
        self._inbound: list[tuple[int, list[Any]]] = []
        self._answerer: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._answering = False
        # Acks waiting for their turn to be written.
        self._acks: set[asyncio.Task[None]] = set()
        self._closed: str | None = None
        # When this end's ping still waiting for its pong was sent (monotonic), if one is.
        self._ping_sent_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self._closed is None

    @property
    def ended(self) -> asyncio.Event:
        """Set once the link is closed and its reader has ended (:meth:`mark_ended`)."""
        if self._ended is None:
            self._ended = asyncio.Event()
            if self._has_ended:
                self._ended.set()
        return self._ended

    def mark_ended(self) -> None:
        self._has_ended = True
        if self._ended is not None:
            self._ended.set()

    @property
    def closed_reason(self) -> str | None:
        return self._closed

    async def send(
        self, messages: Sequence[bytes], timeout_s: float, written: asyncio.Event | None = None
    ) -> list[Result]:
        """Send ``messages`` (each an encoded ``{"path", "envelope"}`` object) in one frame and wait for
        the peer's answer to each; raises :class:`LinkClosed` if the link ends or stalls first. ``written``
        is set once the frame is written, before its answer comes.

        ``timeout_s`` counts from when the frame's last piece was written: however long a large frame
        takes on a slow cable, the link is not closed for it (a link that makes no progress at all is
        found by the pings)."""
        if self._closed is not None:
            raise LinkClosed(self._closed, unsent=True)
        frame_id = self._next_id
        self._next_id += 1
        self.used_at = self._clock()
        answered: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = answered
        try:
            try:
                await self._write(b'{"op":"send","id":%d,"messages":[%b]}' % (frame_id, b",".join(messages)))
                if written is not None:
                    written.set()
            except LinkClosed as exc:
                # Not used again: the next send opens a new link.
                await self.close(str(exc))
                raise
            try:
                results = await asyncio.wait_for(answered, timeout_s)
            except TimeoutError:
                await self.close(f"no answer within {timeout_s:g}s")
                raise LinkClosed(f"no answer within {timeout_s:g}s") from None
        finally:
            self._pending.pop(frame_id, None)
            if answered.done() and not answered.cancelled():
                # Failed as the link ended while the frame was being written: the write's error is raised.
                answered.exception()
        if len(results) != len(messages):
            await self.close("an answer that does not match its frame")
            raise LinkClosed(f"{len(results)} results for {len(messages)} messages")
        return results

    async def run(self) -> None:
        """Read frames until the link closes; the peer's frames are answered one after the other, in order."""
        try:
            while (data := await self._socket.receive()) is not None:
                try:
                    frame = self._put_together(data) if is_part(data) else data
                except PartError as exc:
                    log.warning(
                        "closing the link with twin %s: %s", self.peer, exc, extra=about(twin=self.peer)
                    )
                    await self.close(f"unreadable part: {exc}", code=exc.code)
                    break
                if frame is not None and not await self._dispatch(frame):
                    break
        finally:
            self._closed = self._closed or self._socket.close_reason()
            self.retired = self.retired or self._socket.retired()
            await self._writer.close(self._closed)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(LinkClosed(self._closed))
            # The peer sends again, on its next link, the frames not answered yet; the one being answered
            # is let finish.
            self._inbound.clear()
            self._wake_room()
            if self._answerer is not None:
                with contextlib.suppress(asyncio.CancelledError, LinkClosed):
                    await self._answerer
            await self._socket.close(1000, self._closed)

    @property
    def busy(self) -> bool:
        """A frame of ours waits for its ack, or one of the peer's for its answer (or for the answer's turn to
        be written) or its next parts."""
        return (
            bool(self._pending)
            or self._answering
            or bool(self._inbound)
            or bool(self._acks)
            or self._parts.holding
        )

    async def keep_alive(self, now: float, every_s: float, *, may_close: bool) -> None:
        """Ping the other end when nothing came from it for ``every_s``; close the link when a ping's pong
        did not come within ``every_s`` either, unless ``may_close`` is False (this site itself is late).
        Only an end that notes when it last heard from the other (the opener's) pings."""
        socket = self._socket
        heard_at = getattr(socket, "heard_at", None)
        ping = getattr(socket, "ping", None)
        if not isinstance(heard_at, float) or ping is None or self._closed is not None:
            return
        if self._ping_sent_at is not None:
            if heard_at >= self._ping_sent_at:
                self._ping_sent_at = None
            else:
                if now - self._ping_sent_at >= every_s and may_close:
                    log.warning(
                        "closing the link with twin %s: no pong within %.0fs",
                        self.peer,
                        every_s,
                        extra=about(twin=self.peer),
                    )
                    await self.close(f"no pong within {every_s:g}s")
                return
        if now - heard_at >= every_s:
            self._ping_sent_at = now
            try:
                await ping()
            except LinkClosed as exc:
                await self.close(str(exc))

    async def retire(self, reason: str) -> None:
        """Close the link because this site no longer needs it (not a break: it opens again on need)."""
        self.retired = True
        await self.close(reason, code=RETIRED)

    async def close(self, reason: str, code: int = 1000) -> None:
        """Close the link; frames waiting for an answer fail with :class:`LinkClosed`."""
        if self._closed is None:
            self._closed = reason
        self._wake_room()
        await self._writer.close(self._closed)
        await self._socket.close(code, reason)

    async def _dispatch(self, data: bytes) -> bool:
        self.used_at = self._clock()
        try:
            frame = orjson.loads(data)
            op = frame["op"]
            frame_id = int(frame["id"])
            if op == "ack":
                self._acked(frame_id, frame["results"])
            elif op == "send":
                messages = frame["messages"]
                if not isinstance(messages, list):
                    raise TypeError("messages is not a list")
                await self._take_inbound(frame_id, messages)
            else:
                raise ValueError(f"unknown op {op!r}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("closing the link with twin %s: unreadable frame (%s)", self.peer, exc)
            await self.close(f"unreadable frame: {exc}", code=1003)
            return False
        return True

    def _put_together(self, part: bytes) -> bytes | None:
        """The peer's frame ``part`` completes, or None while more of it is to come."""
        self.used_at = self._clock()
        return self._parts.add(part)

    def _acked(self, frame_id: int, results: list[dict[str, Any]]) -> None:
        future = self._pending.get(frame_id)
        if future is None or future.done():
            return
        future.set_result(
            [
                Result(
                    int(result["status"]),
                    str(result.get("message", "")),
                    float(result["retry_after"]) if "retry_after" in result else None,
                )
                for result in results
            ]
        )

    async def _take_inbound(self, frame_id: int, messages: list[Any]) -> None:
        """Queue one of the peer's frames for its answer (waiting for room first: a flood waits in the
        socket, not here)."""
        while len(self._inbound) >= INBOUND_FRAMES and self._closed is None:
            self._room = asyncio.get_running_loop().create_future()
            await self._room
        if self._closed is not None:
            return
        self._inbound.append((frame_id, messages))
        if self._answerer is None:
            self._answerer = asyncio.ensure_future(self._answer_frames())

    def _wake_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    async def _answer_frames(self) -> None:
        try:
            while self._inbound and self._closed is None:
                frame_id, messages = self._inbound.pop(0)
                self._wake_room()
                self._answering = True
                try:
                    results = await self._answer(self.peer, messages, self.to_relay)
                    ack = orjson.dumps({"op": "ack", "id": frame_id, "results": results})
                    if self._writer.busy:
                        # Behind the parts of a large frame the ack waits its turn; the next frame is
                        # answered meanwhile (the peer matches acks by frame id).
                        self._write_later(ack)
                    else:
                        await self._write(ack)
                except LinkClosed:
                    # The peer sends the frame again on its next link; its envelopes are kept once.
                    return
                finally:
                    self._answering = False
                    self.used_at = self._clock()
        finally:
            self._answerer = None
            self._wake_room()

    async def _write(self, data: bytes) -> None:
        await self._writer.write(data)

    def _write_later(self, data: bytes) -> None:
        task = asyncio.ensure_future(self._writer.write(data))
        self._acks.add(task)
        task.add_done_callback(self._ack_written)

    def _ack_written(self, task: asyncio.Task[None]) -> None:
        self._acks.discard(task)
        if not task.cancelled():
            # A link that closed meanwhile: the peer sends the frame again on its next link.
            task.exception()


async def send_envelopes(
    link: Link, items: Sequence[tuple[str, bytes]], timeout_s: float, written: asyncio.Event | None = None
) -> list[DeliveryError | None]:
    """Send ``(path, signed envelope)`` pairs over ``link``, in order, as few frames as the peer's size
    limit allows; one result per item (None: the peer has it). ``written`` is set once the last frame is
    written (what is written after it comes after all of them)."""
    twin_id, limit = link.peer, link.peer_max_bytes
    results: list[DeliveryError | None] = [None] * len(items)
    sendable: list[int] = []
    messages: list[bytes] = []
    for index, (path, envelope) in enumerate(items):
        if len(envelope) > limit:
            # The peer said how much it takes when the link opened: this one it would refuse.
            results[index] = peer_refusal(twin_id, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large_text(limit))
            continue
        sendable.append(index)
        messages.append(batch_message(path, envelope))
    done = 0
    for chunk in chunks(messages, limit):
        indexes = sendable[done : done + len(chunk)]
        done += len(chunk)
        try:
            answers = await link.send(chunk, timeout_s, written if done == len(messages) else None)
        except LinkClosed as exc:
            error = DeliveryError(f"the link to twin {twin_id} broke: {exc}", offline=True)
            for index in indexes:
                results[index] = error.not_attempted() if exc.unsent else error
            for index in sendable[done:]:
                results[index] = error.not_attempted()
            return results
        for index, answer in zip(indexes, answers, strict=True):
            if answer.status != 200:
                results[index] = peer_refusal(twin_id, answer.status, answer.message, answer.retry_after_s)
    return results
