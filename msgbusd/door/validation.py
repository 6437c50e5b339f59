"""The checks every message taken from a system queue must pass (go-rmb's, with its texts)."""

from __future__ import annotations

from msgbusd.errors import InvalidMessage
from wire import keys
from wire.envelope import PROTOCOL_VERSION, Envelope
from wire.error_texts import (
    MISSING_COMMAND,
    MISSING_DESTINATION,
    MISSING_RETURN_QUEUE,
    RESERVED_COMMAND,
    VERSION_MISMATCH,
)


def validate(env: Envelope, *, need_destination: bool = True) -> None:
    """Raise :class:`InvalidMessage` with the first failing reason, in go-rmb's order."""
    if env.ver != PROTOCOL_VERSION:
        raise InvalidMessage(VERSION_MISMATCH)
    if not env.cmd:
        raise InvalidMessage(MISSING_COMMAND)
    if keys.is_system_queue(keys.command_queue(env.cmd)):
        raise InvalidMessage(RESERVED_COMMAND)
    if need_destination and not env.dst:
        raise InvalidMessage(MISSING_DESTINATION)
    if not env.ret:
        raise InvalidMessage(MISSING_RETURN_QUEUE)
