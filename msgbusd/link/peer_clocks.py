"""How far each peer's clock is from this site's, and what follows from it.

Every envelope carries ``now``, stamped by the site that sends it, and a go-rmb site refuses one stamped
more than 60 s before its own clock. A site whose clock is off (an edge box that booted without a battery
for its clock, and that NTP has not reached) has its messages refused, or refuses everyone else's.

Two ways to learn a peer's clock:

- **Over a link** (msgbus sites): each side of the handshake stamps its frame with its clock and signs the
  stamp with the other side's fresh nonce (:func:`stamp`, :func:`read_stamp`). The offset is proven: it
  lets the door judge a message's age on its sender's clock (:meth:`PeerClocks.fresh_on_senders_clock`),
  so that a skew of minutes loses nothing between msgbus sites, while a replayed message still looks old.
- **From the HTTP ``Date`` of a peer's answer** (go-rmb sites, and msgbus sites sent POSTs): unsigned, to a
  second. It is only said (the log, ``/metrics``, ``/status``, the text of a refusal), never trusted.

Only offsets of a second or more are kept, so a peer whose clock is right costs nothing here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from msgbusd.identity.signing import SignatureError, Signer, verify_digest
from msgbusd.reports.logs import about
from msgbusd.reports.metrics import Metrics

log = logging.getLogger("msgbusd.clocks")

# A peer whose clock is further than this from this site's is named (log, /metrics, /status). A Date header
# is read to within about a second (its resolution, and uvicorn renews it once a second).
CLOCK_OFF_S = 5.0
# Offsets smaller than this are not kept: judging by this site's clock is as good.
KEPT_OFFSET_S = 1.0
# The middle of the second a Date header names.
DATE_RESOLUTION_S = 1.0
# An envelope's ``now`` is in whole seconds.
STAMP_RESOLUTION_S = 1.0


def clock_digest(signer_twin: int, other_twin: int, nonce: str, time_s: float) -> bytes:
    """What a handshake's clock stamp signature covers: who stamps, for whom, the other side's fresh nonce
    (so that an old stamp cannot be played again) and the time."""
    text = f"msgbus-link-clock\n{signer_twin}\n{other_twin}\n{nonce}\n{time_s!r}"
    return hashlib.sha256(text.encode()).digest()


def stamp(signer: Signer, signer_twin: int, other_twin: int, nonce: str, time_s: float) -> dict[str, Any]:
    """The fields that stamp a handshake frame with this site's clock."""
    sig = signer.sign_digest(clock_digest(signer_twin, other_twin, nonce, time_s)).hex()
    return {"time": time_s, "time_sig": sig}


def read_stamp(
    frame: dict[str, Any], signer_twin: int, other_twin: int, nonce: str, public_key: bytes
) -> float | None:
    """The time a handshake frame was stamped with by ``signer_twin``, if the stamp is there and signed by
    its key over our ``nonce``; None otherwise (an older site stamps nothing)."""
    time_s = frame.get("time")
    if isinstance(time_s, bool) or not isinstance(time_s, int | float):
        return None
    try:
        verify_digest(
            str(frame.get("time_sig", "")), clock_digest(signer_twin, other_twin, nonce, time_s), public_key
        )
    except SignatureError:
        return None
    return float(time_s)


def date_time_s(value: str | None) -> float | None:
    """The middle of the second an HTTP ``Date`` header names, as unix time; None if there is none."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp() + DATE_RESOLUTION_S / 2
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


@dataclass(frozen=True)
class PeerOffset:
    """A peer's clock minus this site's, in seconds; ``proven``: measured on a link, signed."""

    offset_s: float
    proven: bool


class PeerClocks:
    """The offsets of the peers' clocks that are a second or more off, and what is said of them."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        *,
        off_s: float = CLOCK_OFF_S,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self.off_s = off_s
        self._offsets: dict[int, PeerOffset] = {}
        # The twins named as off in the log: each is named once, and again when it is back in step.
        self._named: set[int] = set()
        # The twins whose offset /metrics shows: those that were off once (kept up to date since).
        self._shown: set[int] = set()
        # The last Date read: every answer within a second carries the same one.
        self._last_date: tuple[str | None, float | None] = (None, None)

    def now(self) -> float:
        """This site's clock."""
        return self._clock()

    def measured_on_link(self, twin: int, peer_time_s: float, sent_at: float, received_at: float) -> None:
        """``twin`` stamped ``peer_time_s`` between ``sent_at`` and ``received_at`` (this site's clock)."""
        self._measured(twin, peer_time_s - (sent_at + received_at) / 2, proven=True)

    def heard_date(self, twin: int, date: str | None, received_at: float) -> None:
        """``twin``'s site answered at ``received_at`` with the HTTP ``Date`` ``date``. A link's proven
        offset is not replaced by it."""
        if date != self._last_date[0]:
            self._last_date = (date, date_time_s(date))
        peer_time_s = self._last_date[1]
        if peer_time_s is None:
            return
        known = self._offsets.get(twin)
        if known is not None and known.proven:
            return
        offset_s = peer_time_s - received_at
        # To a second or so: only an offset well past that says anything.
        self._measured(twin, offset_s if abs(offset_s) > self.off_s else 0.0, proven=False)

    def signed_stamp(self, twin: int, stamped_s: float, now_s: float) -> None:
        """A message ``twin`` signed with the stamp ``stamped_s`` arrived at ``now_s``: its clock is at
        least that far ahead of this site's (a stamp is never from its future, and a copy played again is
        only older). A proven offset below that is raised: a clock set right while its link stays open no
        longer makes old stamps look fresh."""
        known = self._offsets.get(twin)
        if known is not None and known.proven and stamped_s - now_s > known.offset_s + STAMP_RESOLUTION_S:
            self._measured(twin, stamped_s - now_s, proven=True)

    def offset_s(self, twin: int) -> float | None:
        """How far ``twin``'s clock is ahead of this site's (negative: behind), if known to be off."""
        known = self._offsets.get(twin)
        return known.offset_s if known is not None else None

    def fresh_on_senders_clock(self, twin: int, stamped_s: float, now_s: float, freshness_s: float) -> bool:
        """Whether a message ``twin`` stamped ``stamped_s`` is fresh on ``twin``'s clock as proven on a link.
        Only a signed measurement counts: an unsigned one could make an old message look new."""
        known = self._offsets.get(twin)
        return (
            known is not None and known.proven and now_s - self.on_this_clock(twin, stamped_s) <= freshness_s
        )

    def on_this_clock(self, twin: int, stamped_s: float) -> float:
        """A time ``twin`` stamped, on this site's clock: moved by its offset where a link proved it."""
        known = self._offsets.get(twin)
        return stamped_s - known.offset_s if known is not None and known.proven else stamped_s

    def explain(self, twin: int) -> str:
        """Why ``twin``'s messages, or this site's to it, look old: its clock, in one sentence; "" when its
        clock is not known to be off."""
        offset_s = self.offset_s(twin)
        if offset_s is None or abs(offset_s) <= self.off_s:
            return ""
        return clock_text(twin, offset_s)

    def warnings(self) -> list[str]:
        """One sentence for each peer whose clock is off (for ``/status``)."""
        return [
            clock_text(twin, known.offset_s)
            for twin, known in sorted(self._offsets.items())
            if abs(known.offset_s) > self.off_s
        ]

    def _measured(self, twin: int, offset_s: float, *, proven: bool) -> None:
        if abs(offset_s) < KEPT_OFFSET_S:
            self._offsets.pop(twin, None)
        else:
            self._offsets[twin] = PeerOffset(offset_s, proven)
        off = abs(offset_s) > self.off_s
        if off and twin not in self._named:
            self._named.add(twin)
            log.warning("%s", clock_text(twin, offset_s), extra=about(twin=twin))
        elif not off and twin in self._named:
            self._named.discard(twin)
            log.info(
                "twin %s's clock is within %g s of this site's again",
                twin,
                self.off_s,
                extra=about(twin=twin),
            )
        if self._metrics is not None and (off or twin in self._shown):
            self._shown.add(twin)
            self._metrics.set_peer_clock_offset(twin, offset_s, len(self._named))


def clock_text(twin: int, offset_s: float) -> str:
    """``twin``'s clock, ``offset_s`` from this site's, and what follows, in one sentence."""
    seconds = f"{abs(offset_s):.0f} s"
    if offset_s > 0:
        return (
            f"twin {twin}'s clock is {seconds} ahead of this site's: messages this site stamps look "
            f"{seconds} old to it, and go-rmb refuses those older than 60 s; sync its clock or this "
            "site's (NTP)"
        )
    return (
        f"twin {twin}'s clock is {seconds} behind this site's: messages it stamps look {seconds} old "
        "to this site, and go-rmb refuses those older than 60 s; sync its clock or this site's (NTP)"
    )
