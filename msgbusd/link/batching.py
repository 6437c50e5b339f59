"""Several envelopes in one body: the messages of a ``/zbus-batch`` POST and of a link's ``send`` frame."""

from __future__ import annotations

# Room left in a body for what wraps its messages.
WRAPPING_BYTES = 64


def batch_message(path: str, envelope: bytes) -> bytes:
    """One message of a batch: the endpoint it is meant for, and the encoded (signed) envelope."""
    return b'{"path":"%s","envelope":%b}' % (path.encode(), envelope)


def chunks(messages: list[bytes], max_bytes: int) -> list[list[bytes]]:
    """``messages`` in order, cut so that each body stays under ``max_bytes``; a message larger than that
    goes alone (and the peer's 413 becomes its error)."""
    cut: list[list[bytes]] = [[]]
    size = 0
    for message in messages:
        if cut[-1] and size + len(message) + WRAPPING_BYTES > max_bytes:
            cut.append([])
            size = 0
        cut[-1].append(message)
        size += len(message) + 2
    return cut
