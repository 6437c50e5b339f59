"""A request as a service handler sees it, and how a handler's result becomes the reply envelope."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from wire.envelope import Envelope, encode_payload

# What a handler may return: bytes as they are, text as UTF-8, None as an empty payload, others as JSON.
HandlerResult = bytes | bytearray | memoryview | str | dict[str, Any] | list[Any] | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Request:
    """One request taken from ``msgbus.<cmd>``: the decoded payload and the envelope it came in."""

    data: bytes
    envelope: Envelope

    @property
    def src(self) -> int:
        """The twin that sent the request."""
        return self.envelope.src

    @property
    def cmd(self) -> str:
        return self.envelope.cmd

    @property
    def uid(self) -> str:
        return self.envelope.uid

    def text(self, encoding: str = "utf-8") -> str:
        """The payload decoded as text."""
        return self.data.decode(encoding)

    def json(self) -> Any:
        """The payload parsed as JSON (raises ``ValueError`` when it is not JSON)."""
        return json.loads(self.data)


def encode_result(result: HandlerResult) -> bytes:
    """The reply payload for a handler's return value."""
    if result is None:
        return b""
    if isinstance(result, bytes | bytearray | memoryview):
        return bytes(result)
    if isinstance(result, str):
        return result.encode()
    return json.dumps(result).encode()


def reply_envelope(request: Envelope, data: bytes = b"", err: str = "") -> Envelope:
    """The reply to ``request``: src/dst swapped, new payload and time, same uid/cmd/pxy/ret/exp, no sig."""
    return request.replace(
        src=request.dst[0] if request.dst else 0,
        dst=[request.src],
        dat=encode_payload(data),
        now=int(time.time()),
        err=err,
        sig="",
    )
