"""What each peer did last, for ``/status``: when it last took a message, and its last error.

The peers themselves are forgotten once they are up and idle (:class:`msgbusd.sending.peers.Peers`); this
record outlives them, for the peers most recently sent to, so an operator still sees what went wrong a
minute ago.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Peers remembered at most: the least recently active are dropped first.
MAX_PEERS = 1024


@dataclass
class PeerActivity:
    last_sent_at: float | None = None
    last_error: str = ""
    last_error_at: float | None = None
    last_active_at: float = 0.0


class PeerActivityLog:
    """Per peer twin, the last successful send and the last error (unix times)."""

    def __init__(self, *, max_peers: int = MAX_PEERS, clock: Callable[[], float] = time.time) -> None:
        self._max_peers = max_peers
        self._clock = clock
        self._peers: OrderedDict[int, PeerActivity] = OrderedDict()

    def sent(self, twin: int) -> None:
        """``twin`` took messages."""
        record = self._touch(twin)
        record.last_sent_at = record.last_active_at

    def failed(self, twin: int, cause: str) -> None:
        """A send or a probe to ``twin`` failed because of ``cause``."""
        record = self._touch(twin)
        record.last_error, record.last_error_at = cause, record.last_active_at

    def active_since(self, since: float) -> dict[int, PeerActivity]:
        """The peers active at or after ``since`` (unix time)."""
        return {twin: record for twin, record in self._peers.items() if record.last_active_at >= since}

    def _touch(self, twin: int) -> PeerActivity:
        record = self._peers.get(twin)
        if record is None:
            record = self._peers[twin] = PeerActivity()
            if len(self._peers) > self._max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(twin)
        record.last_active_at = self._clock()
        return record
