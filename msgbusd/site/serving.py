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

from msgbusd.errors import StartupError

# Connections the kernel holds for the daemon to take, at most: the event loop takes all that wait in one
# turn, so this bounds that turn when a herd of edges dials at once (2,048 made turns of up to a second at
# 10,000 edges, 128 a tail of edges whose dials the kernel dropped twice); the kernel has the others dial
# again a second later.
LISTEN_BACKLOG = 512


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """Bind the listening socket up front so a port in use is a clear start-up error. ``::`` is dual-stack.
    With ``reuse_port``, processes that all bind so share the address (the kernel spreads connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        raise StartupError(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from exc
    # Accepted connections inherit this: an answer written in parts must not wait for the peer's ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


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
        backlog=LISTEN_BACKLOG,
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
