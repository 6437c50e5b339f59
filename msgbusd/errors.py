"""msgbusd's exceptions and the RMB ``err`` and HTTP error texts, made in one place.

    MsgbusError
    ├── InvalidMessage         a message fails validation (reason is one of the contract's texts)
    ├── DeliveryError          a send to a peer failed; ``offline``: the peer did not answer at all
    └── RejectedRequest        the HTTP door refuses a message (status + Message)

The wire texts must stay byte-identical to go-rmb's, since clients match on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

# Validation reasons (go-rmb texts).
VERSION_MISMATCH = "protocol version mismatch"
MISSING_COMMAND = "missing command request"
MISSING_DESTINATION = "missing twin destination"
MISSING_RETURN_QUEUE = "return queue not defined"
RESERVED_COMMAND = "invalid command: msgbus.system.* lists belong to the daemon"


# What kind of failure a delivery was, for metrics.
DeliveryErrorKind = Literal["unreachable", "busy", "refused", "not_found", "other"]


class MsgbusError(Exception):
    """Base of every error msgbusd raises on purpose."""


class StartupError(Exception):
    """A reason the daemon cannot start, worded for the operator (one line)."""


class InvalidMessage(MsgbusError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def wire_text(self) -> str:
        return invalid_message_text(self.reason)


class DeliveryError(MsgbusError):
    """A POST to a peer did not get HTTP 200. ``cause`` is what the caller eventually reads.

    ``offline`` is True when the peer's site did not answer at all (no connection, timeout, cut connection,
    or a 502/503/504 from something in front of it), as opposed to a site that refused this message.
    ``retry_after_s`` is set when the site answered 503 with ``Retry-After``: it is up but cannot take
    messages now (its Redis is away); sending again after that long is no new attempt. ``attempted`` is
    False for messages of a send that stopped before their turn because the peer had stopped answering.
    """

    def __init__(
        self,
        cause: str,
        *,
        offline: bool = False,
        kind: DeliveryErrorKind | None = None,
        final: bool = False,
        retry_after_s: float | None = None,
        attempted: bool = True,
    ) -> None:
        super().__init__(cause)
        self.cause = cause
        self.offline = offline
        # Sending again cannot help (the peer refuses the message as too large): no retry is made.
        self.final = final
        self.retry_after_s = retry_after_s
        self.attempted = attempted
        self.kind: DeliveryErrorKind = kind or ("unreachable" if offline else "other")

    def not_attempted(self) -> DeliveryError:
        """The same error for a message that was not sent because of it."""
        return DeliveryError(
            self.cause,
            offline=self.offline,
            kind=self.kind,
            retry_after_s=self.retry_after_s,
            attempted=False,
        )


@dataclass(frozen=True)
class RejectedRequest(MsgbusError):
    """An HTTP request refused at the door, answered with ``status`` and go-rmb's error body."""

    status: int
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.message}"


def invalid_message_text(reason: str) -> str:
    return f"received invalid message: {reason}"


def all_retries_done_text(cause: str) -> str:
    return f"all retries done: {cause}"


def expired_text(exp_s: int) -> str:
    return f"request timeout (expiration reached, {exp_s})"


# Answers of a site that is up but cannot take messages now (e.g. its Redis is down): like no answer.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


def peer_refusal(
    twin_id: int, status: int, message: str, retry_after_s: float | None = None
) -> DeliveryError:
    """The error of a message that ``twin_id``'s site answered with ``status`` (not 200) and ``message``."""
    if retry_after_s is not None:
        return DeliveryError(
            f"twin {twin_id} cannot take messages now: {status} {message}",
            kind="busy",
            retry_after_s=retry_after_s,
        )
    offline = status in UNAVAILABLE_STATUSES
    return DeliveryError(
        f"twin {twin_id} refused the message: {status} {message}",
        offline=offline,
        kind="unreachable" if offline else "refused",
        final=status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    )


def too_large_text(max_bytes: int) -> str:
    """What a site answers (413) to a message over its size limit."""
    return f"message too large: this site takes at most {max_bytes} bytes"


def http_error_body(message: str) -> bytes:
    """The body go-rmb answers errors with (capitalised keys)."""
    return json.dumps({"Status": "error", "Message": message}).encode()


def go_duration(seconds: float) -> str:
    """Format a duration the way Go's ``time.Duration.String`` does, e.g. ``1m5.25s`` or ``2h0m0s``."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    total_ns = round(abs(seconds) * 1e9)
    if total_ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if total_ns >= size:
                return sign + _trim(total_ns / size) + unit
    hours, rest = divmod(total_ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    secs = _trim(rest / 1e9)
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{secs}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"
