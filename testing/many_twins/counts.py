"""What the twins received and answered, in total and per twin, and the JSON ``GET /stats`` and the
command's stats line give of it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from testing.many_twins.twins import TwinRange


@dataclass
class Counts:
    """What the twins received and answered, in total and per twin."""

    # Requests taken, by the way they came: "post" or "link".
    requests: Counter[str] = field(default_factory=Counter)
    # Replies the source site took (answered 200), by the way they went.
    replies: Counter[str] = field(default_factory=Counter)
    replies_failed: int = 0
    # Requests and replies refused (unreadable, stale, unknown source, bad signature).
    refused: int = 0
    # Replies sent to these twins (checked and dropped).
    replies_received: int = 0
    links_opened: int = 0
    links_refused: int = 0
    received: Counter[int] = field(default_factory=Counter)
    answered: Counter[int] = field(default_factory=Counter)
    # Requests whose uid number (``<dst>.<n>``) was not above the last one a site sent the same twin: sent
    # out of order, or again.
    out_of_order: int = 0
    _last_number: dict[tuple[int, int], int] = field(default_factory=dict)

    def took(self, twin: int, source: int, uid: str, way: str) -> None:
        """Count a request ``source`` sent ``twin``."""
        self.requests[way] += 1
        self.received[twin] += 1
        head, _, tail = uid.partition(".")
        if head != str(twin) or not tail.isdigit():
            return
        number, last = int(tail), self._last_number.get((source, twin), 0)
        if number <= last:
            self.out_of_order += 1
        else:
            self._last_number[source, twin] = number

    def as_json(self, twins: TwinRange, links_open: int, *, per_twin: bool = False) -> dict[str, Any]:
        """``requests`` taken and ``replies`` the sites took, each by way (``post``, ``link``);
        ``replies_failed``, ``refused`` (requests and replies that failed go-rmb's checks),
        ``replies_received`` (replies sent to these twins), ``out_of_order`` (requests sent out of order or
        again), ``links`` open, opened and refused; with ``per_twin``, each twin's requests ``received`` and
        replies ``answered``, by twin id."""
        totals = {
            "twins": twins.count,
            "down": len(twins.down),
            "requests": {"post": self.requests["post"], "link": self.requests["link"]},
            "replies": {"post": self.replies["post"], "link": self.replies["link"]},
            "replies_failed": self.replies_failed,
            "refused": self.refused,
            "replies_received": self.replies_received,
            "out_of_order": self.out_of_order,
            "links": {"open": links_open, "opened": self.links_opened, "refused": self.links_refused},
        }
        if not per_twin:
            return totals
        twin_ids = sorted(self.received.keys() | self.answered.keys())
        by_twin = {str(t): {"received": self.received[t], "answered": self.answered[t]} for t in twin_ids}
        return {**totals, "per_twin": by_twin}
