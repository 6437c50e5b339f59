"""Replies as a caller sees them: the payload as bytes, the error text, and the raw envelope."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from client.errors import ProtocolError, RemoteError
from msgbusd.envelope import Envelope, EnvelopeDecodeError, decode_payload


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
