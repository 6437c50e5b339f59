"""``GET /status``: what only the running daemon knows, for ``msgbus status`` (this machine only).

What Redis holds (queue depths, the backlog, dead letters) is not here: ``msgbus status`` reads it from
Redis itself, so that it can show it while the daemon is down.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from msgbusd.link.links import Links
from msgbusd.reports.recent_traffic import RecentTraffic
from msgbusd.sending.peers import Peers

# Peers listed besides those down or sending: those active within this long.
ACTIVE_PEERS_S = 900.0
# Answer within this long, or say the report timed out: the caller waits 2 s by default.
STATUS_TIMEOUT_S = 1.5


def daemon_version() -> str:
    try:
        return version("msgbus")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class StatusReport:
    """Builds the ``/status`` document of one daemon; ``problems`` is the health check's list."""

    twin: int
    peers: Peers
    links: Links | None
    inflight: Callable[[], int]
    traffic: RecentTraffic
    problems: Callable[[], Awaitable[list[str]]]
    started_at: float
    # What the operator should act on though the bus works (shown as degraded, not failing /healthz).
    warnings: Callable[[], list[str]] = list
    clock: Callable[[], float] = time.time

    async def __call__(self) -> dict[str, object]:
        problems = await self.problems()
        now = self.clock()
        return {
            "twin": self.twin,
            "version": daemon_version(),
            "started_at": round(self.started_at, 3),
            "uptime_s": round(now - self.started_at, 3),
            "problems": problems,
            "warnings": self.warnings(),
            "inflight": self.inflight(),
            "links_open": self.links.open_count() if self.links is not None else 0,
            "uplinks": self.links.uplinks_report() if self.links is not None else [],
            "peers": [peer.to_json() for peer in self.peers.report(ACTIVE_PEERS_S)],
            "traffic": self.traffic.snapshot().to_json(),
        }


class StatusEndpoint:
    """The ASGI app of ``/status``: ``200`` and the report as JSON, whatever the problems it lists."""

    def __init__(self, report: Callable[[], Awaitable[dict[str, object]]], timeout_s: float) -> None:
        self._report = report
        self._timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                body, status = await self._report(), 200
        except TimeoutError:
            body, status = {"problems": ["the status report timed out"]}, 503
        response = Response(
            json.dumps(body), status, media_type="application/json", headers={"Cache-Control": "no-store"}
        )
        await response(scope, receive, send)
