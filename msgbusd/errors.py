"""msgbusd's exceptions (their wire texts are in :mod:`wire.error_texts`).

MsgbusError
├── InvalidMessage         a message fails validation (reason is one of the contract's texts)
├── DeliveryError          a send to a peer failed; ``offline``: the peer did not answer at all
└── RejectedRequest        the HTTP door refuses a message (status + Message)
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

from wire.error_texts import invalid_message_text, is_too_old_text

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
    ``waits_for_uplink``: the twin is reached over the uplink it opens to this site, and none is open; what
    waits for it is sent when one opens (no attempt is spent meanwhile). ``clock_off``: the site refused the
    message as too old, and its clock is known to be off from this site's.
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
        waits_for_uplink: bool = False,
        clock_off: bool = False,
    ) -> None:
        super().__init__(cause)
        self.clock_off = clock_off
        self.cause = cause
        self.offline = offline
        # Sending again cannot help (the peer refuses the message as too large): no retry is made.
        self.final = final
        self.retry_after_s = retry_after_s
        self.attempted = attempted
        self.waits_for_uplink = waits_for_uplink
        self.kind: DeliveryErrorKind = kind or ("unreachable" if offline else "other")

    def not_attempted(self) -> DeliveryError:
        """The same error for a message that was not sent because of it."""
        return DeliveryError(
            self.cause,
            offline=self.offline,
            kind=self.kind,
            retry_after_s=self.retry_after_s,
            attempted=False,
            waits_for_uplink=self.waits_for_uplink,
        )


@dataclass(frozen=True)
class RejectedRequest(MsgbusError):
    """An HTTP request refused at the door, answered with ``status`` and go-rmb's error body."""

    status: int
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.message}"


# Answers of a site that is up but cannot take messages now (e.g. its Redis is down): like no answer.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


def peer_refusal(
    twin_id: int, status: int, message: str, retry_after_s: float | None = None, *, clock: str = ""
) -> DeliveryError:
    """The error of a message that ``twin_id``'s site answered with ``status`` (not 200) and ``message``.
    ``clock``: what is known of that site's clock being off, said when it refused the message as too old
    (sending again cannot help while the clocks differ)."""
    if clock and is_too_old_text(message):
        return DeliveryError(
            f"twin {twin_id} refused the message: {status} {message}: {clock}",
            kind="refused",
            final=True,
            clock_off=True,
        )
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
