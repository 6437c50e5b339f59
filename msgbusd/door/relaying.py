"""What a relay (``msgbusd --relay``) does with a message for a twin it relays: keeps it, as its source signed
it, in its own Redis until it can send it on over the link that twin keeps to it.

A message is kept once per source twin and what it is (a re-send is answered 200 and not kept again), in the
destination's send queue like a reply waiting to go back, with the same guarantees: nothing is lost on a
restart, and it waits (without spending a try) while the twin's link is not open, until its lifetime ends.
Its payload was encrypted for the destination by its source: the relay can read none of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence, Set

from msgbusd.errors import RejectedRequest
from msgbusd.link.peer_clocks import PeerClocks
from msgbusd.reports.metrics import Metrics
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.queues import RelayedMessage, Store
from twin_resolver.base import Resolver, ResolverError, TwinNotFound
from wire import keys
from wire.envelope import Envelope

Kick = Callable[[Mapping[int, list[SendItem] | None], Set[int]], None]
# What identifies a message, and how long its re-sends may still arrive (the door's de-duplication).
SeenId = Callable[[Envelope], str]
DedupTtl = Callable[[Envelope, float], int]


class Relaying:
    """Takes the messages of other twins for the twins this site relays."""

    def __init__(
        self,
        store: Store,
        resolver: Resolver,
        kick: Kick,
        *,
        seen_id: SeenId,
        dedup_ttl_s: DedupTtl,
        freshness_s: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        clocks: PeerClocks | None = None,
    ) -> None:
        self._store = store
        # A message is kept until its lifetime ends on its sender's clock, where a link measured it.
        self._clocks = clocks or PeerClocks(clock)
        self._resolver = resolver
        self._kick = kick
        self._seen_id = seen_id
        self._dedup_ttl_s = dedup_ttl_s
        self._freshness_s = freshness_s
        self._metrics = metrics
        self._clock = clock

    async def check(self, env: Envelope) -> None:
        """Refuse a message for a twin this site does not relay (its entry names no relay)."""
        dst = env.dst[0]
        try:
            twin = await self._resolver.get_twin(dst)
        except TwinNotFound as exc:
            raise RejectedRequest(400, f"destination twin {dst} not found") from exc
        except ResolverError as exc:
            raise RejectedRequest(502, f"couldn't get destination twin {dst}: {exc}") from exc
        if not twin.relay:
            raise RejectedRequest(
                400,
                f"twin {dst} is not reached through a relay: this site relays for the twins whose "
                "entry names one",
            )

    async def take(self, messages: Sequence[tuple[bool, Envelope]]) -> None:
        """Keep ``(is a request, envelope)`` messages for their destinations and wake their senders."""
        now = self._clock()
        kept = []
        for is_request, env in messages:
            dst = env.dst[0]
            kind = "req" if is_request else "rep"
            kept.append(
                RelayedMessage(
                    dst=dst,
                    key=keys.relayed_key(dst, env.src, is_request, env.uid),
                    payload=env.encode(),
                    state={
                        "first": now,
                        "attempts": 0,
                        "deadline": self._clocks.on_this_clock(env.src, env.now) + env.lifetime_s,
                    },
                    seen=keys.seen(env.src, f"{kind}.{self._seen_id(env)}"),
                    ttl_s=self._dedup_ttl_s(env, self._freshness_s),
                )
            )
        lengths = await self._store.relay_many(kept)
        ready: dict[int, list[SendItem] | None] = {}
        queue_lengths: dict[int, int] = {}
        for message, (_, env), length in zip(kept, messages, lengths, strict=True):
            if not length:
                continue
            queue_lengths[message.dst] = length
            items = ready.setdefault(message.dst, [])
            if items is not None:
                items.append(SendItems.reply(message.key, env, message.state))
        queued = sum(1 for length in lengths if length)
        if queued:
            self._metrics.message("relayed", queued)
        if queued < len(kept):
            self._metrics.message("duplicate", len(kept) - queued)
        # Send queues that hold nothing but what was just queued: their senders know them whole.
        alone = {dst for dst, items in ready.items() if items and queue_lengths[dst] == len(items)}
        self._kick(ready, alone)
