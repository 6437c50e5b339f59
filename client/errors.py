"""The exceptions the client library raises on purpose.

ClientError
├── CallTimeout     not every destination answered in time (carries the replies that did arrive)
├── RemoteError     a reply carries an error (raised only by the convenience methods)
├── ProtocolError   something popped from Redis is not a usable envelope
└── HandlerError    raised by a service handler: reply with exactly this error text
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from client.replies import Reply


class ClientError(Exception):
    """Base of every error the client library raises on purpose."""


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


class ProtocolError(ClientError):
    """An item popped from Redis is not a usable envelope; ``raw`` is the item as popped."""

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class HandlerError(ClientError):
    """Raise in a service handler to reply with exactly ``str(error)`` as ``err`` (no exception type name)."""
