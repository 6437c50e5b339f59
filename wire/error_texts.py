"""The RMB ``err`` texts and HTTP error bodies, byte-identical to go-rmb's: clients match on them."""

from __future__ import annotations

import json

# Validation reasons (go-rmb texts).
VERSION_MISMATCH = "protocol version mismatch"
MISSING_COMMAND = "missing command request"
MISSING_DESTINATION = "missing twin destination"
MISSING_RETURN_QUEUE = "return queue not defined"
RESERVED_COMMAND = "invalid command: msgbus.system.* lists belong to the daemon"


def invalid_message_text(reason: str) -> str:
    return f"received invalid message: {reason}"


def all_retries_done_text(cause: str) -> str:
    return f"all retries done: {cause}"


_EXPIRED = "request timeout (expiration reached"


def expired_text(exp_s: int) -> str:
    return f"{_EXPIRED}, {exp_s})"


def is_expired_text(err: str) -> bool:
    """Whether ``err`` says the request's lifetime ran out before an answer came (from any site)."""
    return err.startswith(_EXPIRED)


_TOO_OLD = "message is too old"


def too_old_text(age: str, sent_s: int, now_s: int) -> str:
    """What a site answers (400) to a message stamped longer ago than it takes (go-rmb's text); ``age`` is
    :func:`go_duration`'s."""
    return f"{_TOO_OLD}, sent since {age}, sent time: {sent_s}, now: {now_s}"


def is_too_old_text(message: str) -> bool:
    """Whether a site refused a message as stamped too long ago (by its clock)."""
    return message.startswith(_TOO_OLD)


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
