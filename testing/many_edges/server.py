"""Running the edges: their twin entries added to the twin file, the edges dialing the cloud site, and the
control endpoints served on loopback until told to stop (:data:`READY_LINE` says where, once they dial)."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from msgbusd.site.open_files import raise_open_files_limit
from testing.many_edges.edges import ManyEdges, edge_entries
from testing.many_twins.twins import CONTROL_HOST, add_to_twin_file, twin_signer
from twin_resolver.static import StaticResolver

READY_LINE = "many-edges ready"


@dataclass(frozen=True)
class Settings:
    cloud: int
    first: int
    count: int
    twins_file: Path
    port: int
    timeout_s: float = 10.0
    ping_s: float = 5.0
    reply_bytes: int | None = None


async def serve(settings: Settings, stopping: asyncio.Event, on_ready: Callable[[str], None]) -> ManyEdges:
    """Run the edges until ``stopping``; ``on_ready`` gets a line saying where the counts are."""
    raise_open_files_limit()
    add_to_twin_file(settings.twins_file, edge_entries(settings.first, settings.count, twin_signer))
    edges = ManyEdges(
        settings.cloud,
        settings.first,
        settings.count,
        twin_signer,
        StaticResolver(settings.twins_file),
        timeout_s=settings.timeout_s,
        ping_s=settings.ping_s,
        reply_bytes=settings.reply_bytes,
    )
    runner = web.AppRunner(_app(edges, stopping), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, CONTROL_HOST, settings.port).start()
        on_ready(
            f"{READY_LINE}: http://{CONTROL_HOST}:{settings.port}, edges {settings.first}-"
            f"{settings.first + settings.count - 1} keeping uplinks to twin {settings.cloud}"
        )
        await edges.run(stopping)
    finally:
        await runner.cleanup()
    return edges


def stats(edges: ManyEdges, *, opened: bool = False) -> dict[str, object]:
    """The counts, in all: uplinks open, dials and upgrades, requests and replies each way; ``opened``: also
    when each open uplink opened and when the last dials were made (unix time)."""
    counts = edges.counts
    round_trips = sorted(counts.round_trips_s)
    answer: dict[str, object] = {
        "edges": len(edges.edges),
        "open": edges.open_count(),
        "dials": edges.http.dials,
        "upgrades": edges.http.upgrades,
        "requests_answered": counts.requests_answered,
        "replies_failed": counts.replies_failed,
        "requests_sent": counts.requests_sent,
        "requests_refused": counts.requests_refused,
        "replies": counts.replies,
        "round_trip_p50_s": statistics.median(round_trips) if round_trips else None,
        "round_trip_p99_s": round_trips[int(0.99 * (len(round_trips) - 1))] if round_trips else None,
    }
    if opened:
        answer["opened_at"] = sorted(edges.opened_at())
        answer["dialed_at"] = list(edges.http.dialed_at)
    return answer


def _app(edges: ManyEdges, stopping: asyncio.Event) -> web.Application:
    sending: set[asyncio.Task[None]] = set()

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats(edges, opened=request.query.get("opened") == "1"))

    async def send(request: web.Request) -> web.Response:
        """``POST /send?cmd=C&rate=R[&count=N]``: requests from the edges to the cloud's ``C``, at R a second
        (0: one from every edge, at once)."""
        query = request.query
        count = int(query["count"]) if "count" in query else None
        work = edges.send_requests(query["cmd"], float(query.get("rate", "0")), count, stopping)
        task = asyncio.ensure_future(work)
        sending.add(task)
        task.add_done_callback(sending.discard)
        return web.json_response({"sending": query["cmd"]})

    app = web.Application()
    app.router.add_get("/stats", get_stats)
    app.router.add_post("/send", send)
    return app


def stats_text(edges: ManyEdges) -> str:
    return json.dumps(stats(edges))
