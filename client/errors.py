"""The exceptions the client library raises on purpose.

ClientError
├── CallTimeout     not every destination answered in time (carries the replies that did arrive)
├── RemoteError     a reply carries an error (raised only by the convenience methods)
├── ProtocolError   something popped from Redis is not a usable envelope
├── SiteRedisFull   the site's Redis refused a write: it reached its maxmemory (trying again later can help)
└── HandlerError    raised by a service handler: reply with exactly this error text

The two that carry replies live with them, in :mod:`client.replies`. Redis's own errors (connection lost,
timeouts) come through as ``redis.exceptions`` ones, but for its refusal of a write for want of memory,
which :func:`refused_when_full` turns into :class:`SiteRedisFull` where the library writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import OutOfMemoryError


class ClientError(Exception):
    """Base of every error the client library raises on purpose."""


class ProtocolError(ClientError):
    """An item popped from Redis is not a usable envelope; ``raw`` is the item as popped."""

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class SiteRedisFull(ClientError):
    """The site's Redis refused a write (``OOM command not allowed when used memory > 'maxmemory'``): it is
    full, with ``maxmemory-policy noeviction``. What it refused, ``refused``, was not stored; ``outcome``
    says what became of the rest."""

    def __init__(self, refused: str, outcome: str = "") -> None:
        message = (
            f"the site's Redis is full (maxmemory reached): it refuses {refused} until memory is freed or "
            "maxmemory is raised"
        )
        super().__init__(f"{message}; {outcome}" if outcome else message)
        self.refused = refused
        self.outcome = outcome


class HandlerError(ClientError):
    """Raise in a service handler to reply with exactly ``str(error)`` as ``err`` (no exception type name)."""


@contextmanager
def refused_when_full(refused: str, outcome: str = "") -> Iterator[None]:
    """Turn Redis's refusal of a write for want of memory, inside the block, into :class:`SiteRedisFull`."""
    try:
        yield
    except OutOfMemoryError as exc:
        raise SiteRedisFull(refused, outcome) from exc
