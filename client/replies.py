"""Replies as a caller sees them (the payload as bytes, the error text, the raw envelope), and the errors that
carry them."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from client.errors import ClientError, ProtocolError
from wire.envelope import Envelope, EnvelopeDecodeError, decode_payload


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer to a request.

    ``src`` is the twin the reply answers for: the replying twin, or, for an error a daemon sends on a
    destination's behalf (e.g. "all retries done"), that destination when it is known. ``error`` is empty on
    success. ``envelope`` is the message exactly as decoded.
    """

    src: int
    data: bytes
    error: str
    uid: str
    envelope: Envelope

    @classmethod
    def from_envelope(cls, envelope: Envelope, src: int | None = None) -> Reply:
        """Build a reply from a decoded envelope; raises :class:`ProtocolError` if ``dat`` is not base64."""
        try:
            data = decode_payload(envelope.dat)
        except ValueError as exc:
            if not envelope.err:
                raise ProtocolError(f"reply from twin {envelope.src}: {exc}", envelope.encode()) from exc
            data = b""  # the error text is what matters; a daemon's error copy may carry anything in dat
        return cls(
            src=envelope.src if src is None else src,
            data=data,
            error=envelope.err,
            uid=envelope.uid,
            envelope=envelope,
        )

    @property
    def ok(self) -> bool:
        """True when the reply carries no error."""
        return not self.error

    def raise_for_error(self) -> Reply:
        """Raise :class:`RemoteError` if the reply carries an error, else return the reply itself."""
        if self.error:
            raise RemoteError(self.error, self.src, self)
        return self

    def text(self, encoding: str = "utf-8") -> str:
        """The payload decoded as text."""
        return self.data.decode(encoding)

    def json(self) -> Any:
        """The payload parsed as JSON; raises :class:`ProtocolError` when it is not JSON."""
        try:
            return json.loads(self.data)
        except ValueError as exc:
            raise ProtocolError(f"reply from twin {self.src} is not JSON: {exc}", self.data) from exc

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: the payload as UTF-8 text, or as base64 with ``"base64": true``."""
        try:
            data, is_base64 = self.data.decode("utf-8"), False
        except UnicodeDecodeError:
            data, is_base64 = base64.b64encode(self.data).decode("ascii"), True
        return {"src": self.src, "uid": self.uid, "data": data, "base64": is_base64, "error": self.error}


def decode_envelope(raw: bytes | str) -> Envelope:
    """Decode an item popped from Redis; raises :class:`ProtocolError` when it is not an envelope."""
    try:
        return Envelope.decode(raw)
    except EnvelopeDecodeError as exc:
        raise ProtocolError(f"undecodable reply: {exc.reason}", exc.raw) from exc


class CallTimeout(ClientError):
    """Not all replies arrived on ``ret`` within ``timeout`` seconds.

    ``missing`` names the destinations that did not answer (empty when the caller did not say which twins it
    waits for, as with ``wait``); ``replies`` holds the replies that did arrive. Late replies stay on ``ret``
    for a while (the daemon refreshes its TTL on every push) and can still be fetched with ``wait``.
    """

    def __init__(
        self, ret: str, timeout: float, expected: int, replies: Sequence[Reply], missing: Sequence[int] = ()
    ) -> None:
        self.ret = ret
        self.timeout = timeout
        self.expected = expected
        self.replies = list(replies)
        self.missing = tuple(missing)
        if self.missing:
            twins = ", ".join(str(twin) for twin in self.missing)
            what = f"no reply from twin{'s' if len(self.missing) > 1 else ''} {twins}"
        else:
            what = f"{len(self.replies)} of {expected} replies arrived"
        super().__init__(f"timed out after {timeout:g}s: {what} (return queue {ret})")


class RemoteError(ClientError):
    """A reply from twin ``src`` carries the error text ``error``."""

    def __init__(self, error: str, src: int, reply: Reply | None = None) -> None:
        super().__init__(f"twin {src}: {error}")
        self.error = error
        self.src = src
        self.reply = reply
