"""The exceptions the client library raises on purpose.

ClientError
├── CallTimeout     not every destination answered in time (carries the replies that did arrive)
├── RemoteError     a reply carries an error (raised only by the convenience methods)
├── ProtocolError   something popped from Redis is not a usable envelope
└── HandlerError    raised by a service handler: reply with exactly this error text

The two that carry replies live with them, in :mod:`client.replies`.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error the client library raises on purpose."""


class ProtocolError(ClientError):
    """An item popped from Redis is not a usable envelope; ``raw`` is the item as popped."""

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class HandlerError(ClientError):
    """Raise in a service handler to reply with exactly ``str(error)`` as ``err`` (no exception type name)."""
