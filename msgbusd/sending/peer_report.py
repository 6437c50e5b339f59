"""One peer in ``/status``: its state (:mod:`msgbusd.sending.health`) and what it did last
(:mod:`msgbusd.reports.peer_activity`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from msgbusd.reports.peer_activity import PeerActivity
from msgbusd.sending.health import HealthState, PeerState


@dataclass(frozen=True)
class PeerReport:
    """A peer as ``/status`` shows it; times are unix times."""

    twin: int
    state: PeerState
    down_since: float | None
    cause: str
    probes: int
    next_probe_in_s: float | None
    last_sent_at: float | None
    last_error: str
    last_error_at: float | None

    @classmethod
    def of(cls, twin: int, health: HealthState, activity: PeerActivity | None, now: float) -> PeerReport:
        activity = activity or PeerActivity()
        up = health.state == "up"
        return cls(
            twin=twin,
            state=health.state,
            down_since=None if up else now - health.down_for_s,
            cause=health.cause,
            probes=health.probes,
            next_probe_in_s=None if up else health.next_probe_in_s,
            last_sent_at=activity.last_sent_at,
            last_error=activity.last_error,
            last_error_at=activity.last_error_at,
        )

    def to_json(self) -> dict[str, object]:
        return {name: _rounded(value) for name, value in asdict(self).items()}


def _rounded(value: object) -> object:
    # Milliseconds are plenty for times and delays an operator reads.
    return round(value, 3) if isinstance(value, float) else value
