"""What every peer's sender shares with the others: the site's Redis and its send queues, the schedule, the
links and POSTs, the turns at sending and at probing (at most ``workers`` of each at once), the clock, the
metrics, and how an envelope is stamped, sealed and signed for the wire.

:class:`msgbusd.sending.peers.Peers` holds all of it, and each :class:`msgbusd.sending.peer.Peer` it makes
refers to it. A peer's sender and the parts it sends with (:mod:`msgbusd.sending.batch_window`,
:mod:`msgbusd.sending.transmit`, :mod:`msgbusd.sending.large_sends`) see it as :class:`Senders`, and need
nothing else of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from msgbusd.errors import DeliveryError
from msgbusd.link.links import Links
from msgbusd.link.way_back import WayBack
from msgbusd.reports.metrics import Metrics
from msgbusd.reports.peer_activity import PeerActivityLog
from msgbusd.sending.health import ProbePace
from msgbusd.sending.posts import PostClient
from msgbusd.sending.schedule import Schedule
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.leases import Leases
from msgbusd.store.queues import Store
from twin_resolver.base import Twin
from wire.backoff import Backoff


class Senders(Protocol):
    """The site's peers, as each peer's sender sees them (see :class:`msgbusd.sending.peers.Peers`)."""

    store: Store
    items: SendItems
    schedule: Schedule
    posts: PostClient
    links: Links | None
    links_timeout_s: float
    leases: Leases | None
    way_back: WayBack | None
    stopping: asyncio.Event
    probes: Backoff
    probe_pace: ProbePace
    large_message_bytes: int
    link_after: int
    turns: asyncio.Semaphore
    probe_turns: asyncio.Semaphore
    clock: Callable[[], float]
    metrics: Metrics
    activity: PeerActivityLog

    def holds(self, dst: int) -> bool: ...

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None: ...

    async def relayed_twin(self, twin_id: int) -> Twin | None: ...

    def sign(self, item: SendItem, seal_for: Twin | None = None) -> bytes: ...

    def count_sent(self, items: list[SendItem]) -> list[str]: ...

    def record_attempt(
        self, item: SendItem, error: DeliveryError | None, started_at: float, duration_us: int
    ) -> None: ...
