"""uvicorn as the daemon, the router and the gateway run it: on a socket bound up front, quiet, and without
signal handlers of its own (the process that runs it owns SIGTERM and SIGINT)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server(app: ASGIApp, grace_s: float, **options: Any) -> QuietServer:
    """A server of ``app`` that gives requests in flight ``grace_s`` when it stops; ``options`` are more of
    uvicorn's settings."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=max(1, int(grace_s)),
        **options,
    )
    return QuietServer(config)


async def serve_until(app: ASGIApp, sock: socket.socket, stopping: asyncio.Event, grace_s: float) -> None:
    """Serve ``app`` on ``sock`` until ``stopping`` is set."""
    quiet = server(app, grace_s)
    serving = asyncio.create_task(quiet.serve(sockets=[sock]))
    await stopping.wait()
    quiet.should_exit = True
    await serving
