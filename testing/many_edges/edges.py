"""The edges themselves: each one a twin with its own key and no address, keeping an uplink to the cloud site
with msgbusd's own link code (:class:`~msgbusd.link.links.Links`, ``--uplink``: the same handshake and the
same redial policy), answering what the cloud sends it, and sending the cloud's services requests."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from msgbusd.errors import DeliveryError
from msgbusd.identity.signing import Signer
from msgbusd.link.http_client import HttpClients
from msgbusd.link.links import Links
from msgbusd.link.open_link import Link, send_envelopes
from msgbusd.sending.posts import REMOTE_PATH, REPLY_PATH
from twin_resolver.base import Resolver, Twin
from wire.backoff import sleep_unless
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES, Envelope, encode_payload, envelope_size_limit

log = logging.getLogger("many_edges")

# Replies are sent back over the edges' uplinks by this many workers.
REPLY_WORKERS = 64
# What an edge's requests name as their return queue (the cloud's replies come back over the uplink).
REPLY_QUEUE = "msgbus.system.reply"
# Dials whose time is kept, the last ones.
KEPT_DIALS = 200_000
# Edge-to-cloud round trips kept for the percentiles.
KEPT_ROUND_TRIPS = 100_000
# Random draws for an edge whose uplink is open before a request waits a little for one to open.
PICK_TRIES = 20
# Every edge's uplink is looked at for its ping this often, by one task for all (an edge's msgbusd looks
# every second; the pings themselves go every 25 s), a slice of edges at a time spread over the sweep: real
# edges' pings come one by one as their links' silences end, not a fifth of them at once every sweep (which
# had the cloud answer a thousand pings in one burst and held up its requests behind them).
PING_SWEEP_S = 5.0
PING_SLICE = 50


def edge_entries(first: int, count: int, signer_of: Callable[[int], Signer]) -> list[Twin]:
    """The twin file's entries of the edges: no address (reached only over the uplinks they open)."""
    return [
        Twin(id=twin, address="", public_key=signer_of(twin).public_key)
        for twin in range(first, first + count)
    ]


class CountingHttp(HttpClients):
    """The edges' HTTP client, counting each uplink dial (a WebSocket upgrade asked for) and those the cloud
    took; any number of WebSockets to one site (one per edge)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s, per_origin=0)
        self.dials = 0
        self.upgrades = 0
        # When each dial was made (unix time), the last KEPT_DIALS of them.
        self.dialed_at: deque[float] = deque(maxlen=KEPT_DIALS)

    async def websocket(self, url: str, **options: Any) -> Any:
        self.dials += 1
        self.dialed_at.append(time.time())
        socket = await super().websocket(url, **options)
        self.upgrades += 1
        return socket


@dataclass
class Edge:
    twin: int
    signer: Signer
    links: Links


@dataclass
class EdgeCounts:
    """What the edges did, in all."""

    requests_answered: int = 0  # requests of the cloud answered by an edge
    requests_sent: int = 0  # requests of the edges to the cloud's services, taken by the cloud
    requests_refused: int = 0  # ... not taken (the cloud answered an error, or the uplink was closed)
    replies: int = 0  # replies to those from the cloud
    replies_failed: int = 0  # replies of the edges that could not be sent back
    round_trips_s: list[float] = field(default_factory=list)


class ManyEdges:
    """``count`` edges from twin ``first``, each keeping an uplink to ``cloud``."""

    def __init__(
        self,
        cloud: int,
        first: int,
        count: int,
        signer_of: Callable[[int], Signer],
        resolver: Resolver,
        *,
        timeout_s: float = 10.0,
        ping_s: float = 5.0,
        reply_bytes: int | None = None,
    ) -> None:
        self.cloud = cloud
        self.http = CountingHttp(timeout_s)
        self.counts = EdgeCounts()
        self._reply_bytes = reply_bytes
        self._timeout_s = timeout_s
        self._pending: dict[tuple[int, str], float] = {}
        self._replies: asyncio.Queue[tuple[Edge, bytes]] = asyncio.Queue()
        self._uids = itertools.count(1)
        self._requests: set[asyncio.Task[None]] = set()
        max_bytes = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES)
        self.edges: dict[int, Edge] = {}
        for twin in range(first, first + count):
            signer = signer_of(twin)
            links = Links(
                twin,
                signer,
                resolver,
                self.http,
                self._answerer(twin),
                timeout_s=timeout_s,
                ping_s=ping_s,
                max_frame_bytes=max_bytes,
                uplinks=(cloud,),
            )
            self.edges[twin] = Edge(twin, signer, links)

    async def run(self, stopping: asyncio.Event) -> None:
        """Keep every edge's uplink, and send the replies back, until ``stopping``."""
        async with asyncio.TaskGroup() as group:
            workers = [group.create_task(self._send_replies()) for _ in range(REPLY_WORKERS)]
            workers.append(group.create_task(self._ping(stopping)))
            for edge in self.edges.values():
                group.create_task(edge.links.keep_uplinks(stopping), name=f"edge {edge.twin}")
            await stopping.wait()
            for task in [*workers, *self._requests]:
                task.cancel()
        await asyncio.gather(*(edge.links.aclose() for edge in self.edges.values()))
        await self.http.aclose()

    async def _ping(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            # Ten thousand edges' objects take a walk of Python's cyclic collector a second and a half,
            # during which no edge answers the cloud (its round trips would show the edges' pause, not the
            # cloud's): what lives now is set aside for good. Cycles among it are never collected, which a
            # benchmark's minutes do not feel.
            gc.collect(1)
            gc.freeze()
            edges = list(self.edges.values())
            started = time.monotonic()
            for first in range(0, len(edges), PING_SLICE):
                now = time.monotonic()
                for edge in edges[first : first + PING_SLICE]:
                    await edge.links.ping_due(now)
                done_at = started + PING_SWEEP_S * (first + PING_SLICE) / len(edges)
                await sleep_unless(stopping, max(0.0, done_at - time.monotonic()))
                if stopping.is_set():
                    return
            if not edges:
                await sleep_unless(stopping, PING_SWEEP_S)

    def open_count(self) -> int:
        return sum(1 for edge in self.edges.values() if edge.links.open_count())

    def opened_at(self) -> list[float]:
        """When each edge's open uplink opened (unix time)."""
        times = []
        for edge in self.edges.values():
            for uplink in edge.links.uplinks_report():
                if uplink["open"] and uplink["since"] is not None:
                    times.append(float(uplink["since"]))
        return times

    async def send_requests(
        self, cmd: str, rate_per_s: float, count: int | None, stopping: asyncio.Event
    ) -> None:
        """Requests for the cloud's ``cmd``, from edges taken at random among those whose uplink is open, at
        ``rate_per_s`` (0: from every edge once, at once); ``count`` at most."""
        if rate_per_s <= 0:
            await asyncio.gather(*(self._request(edge, cmd) for edge in self.edges.values()))
            return
        started, sent = time.monotonic(), 0
        edges = list(self.edges.values())
        while not stopping.is_set() and (count is None or sent < count):
            edge = self._open_edge(edges)
            if edge is not None:
                task = asyncio.ensure_future(self._request(edge, cmd))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
                sent += 1
            delay = started + sent / rate_per_s - time.monotonic()
            await asyncio.sleep(max(0.0, delay) if edge is not None else 0.05)

    @staticmethod
    def _open_edge(edges: list[Edge]) -> Edge | None:
        """An edge taken at random among those whose uplink is open (a few draws, not a walk of all)."""
        for _ in range(PICK_TRIES):
            edge = random.choice(edges)
            if edge.links.open_count():
                return edge
        return None

    async def _request(self, edge: Edge, cmd: str) -> None:
        uid = f"{self.cloud}.{next(self._uids)}"
        payload = encode_payload(f"edge {edge.twin}".encode())
        env = Envelope(
            uid=uid,
            cmd=cmd,
            src=edge.twin,
            dst=(self.cloud,),
            ret=REPLY_QUEUE,
            dat=payload,
            exp=60,
            now=int(time.time()),
        )
        self._pending[(edge.twin, uid)] = time.monotonic()
        error = await self._send(edge, REMOTE_PATH, edge.signer.sign(env).encode())
        if error:
            self._pending.pop((edge.twin, uid), None)
            self.counts.requests_refused += 1
            log.info("edge %s: request %s not taken: %s", edge.twin, uid, error)
        else:
            self.counts.requests_sent += 1

    async def _send(self, edge: Edge, path: str, envelope: bytes) -> str:
        """Send one envelope over ``edge``'s uplink; "" once the cloud has it, else why not."""
        link = await self._uplink(edge)
        if link is None:
            return "no uplink open"
        (result,) = await send_envelopes(link, [(path, envelope)], self._timeout_s)
        return "" if result is None else result.cause

    async def _uplink(self, edge: Edge) -> Link | None:
        """The edge's open uplink; None while it has none (its own loop dials it, with its backoff)."""
        if not edge.links.open_count():
            return None
        try:
            return await edge.links.link_to(self.cloud, open_new=False)
        except DeliveryError:
            return None

    def _answerer(self, twin: int) -> Callable[[int, list[Any], bool], Awaitable[list[dict[str, Any]]]]:
        async def answer(peer: int, messages: list[Any], through_relay: bool) -> list[dict[str, Any]]:
            edge = self.edges[twin]
            results: list[dict[str, Any]] = []
            for message in messages:
                try:
                    env = Envelope.from_wire(message["envelope"])
                except Exception as exc:
                    results.append({"status": 400, "message": f"couldn't parse json: {exc}"})
                    continue
                results.append({"status": 200})
                if message.get("path") == REPLY_PATH:
                    self._replied(edge, env)
                else:
                    self._replies.put_nowait((edge, self._reply_to(edge, env)))
            return results

        return answer

    def _replied(self, edge: Edge, env: Envelope) -> None:
        sent_at = self._pending.pop((edge.twin, env.uid), None)
        if sent_at is None:
            return  # a reply sent again: the first was counted
        self.counts.replies += 1
        if len(self.counts.round_trips_s) < KEPT_ROUND_TRIPS:
            self.counts.round_trips_s.append(time.monotonic() - sent_at)

    def _reply_to(self, edge: Edge, request: Envelope) -> bytes:
        dat = encode_payload(b"x" * self._reply_bytes) if self._reply_bytes is not None else request.dat
        reply = request.replace(src=edge.twin, dst=(request.src,), dat=dat, now=int(time.time()), sig="")
        return edge.signer.sign(reply).encode()

    async def _send_replies(self) -> None:
        while True:
            edge, reply = await self._replies.get()
            # The cloud sends a request again until it has its reply: one that fails now comes back.
            error = await self._send(edge, REPLY_PATH, reply)
            if error:
                self.counts.replies_failed += 1
            else:
                self.counts.requests_answered += 1
