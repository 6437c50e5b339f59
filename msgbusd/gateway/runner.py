"""``msgbus gateway``: serve RMB's HTTP proxy endpoints (see :mod:`msgbusd.gateway.app`) for clients that
have no site of their own, such as the npm ``ts-rmb-http-client`` in a browser.

It holds no state: it looks the twin up, forwards the body to the twin's daemon over a keep-alive HTTP
client and answers what the daemon answers. The first SIGTERM/SIGINT stops accepting connections and lets
requests in flight finish (up to ``drain_grace_s``); a second one stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from msgbusd.errors import StartupError
from msgbusd.gateway.app import Nodes, create_gateway_app
from msgbusd.site.serving import bind_socket
from msgbusd.site.serving import server as quiet_server
from twin_resolver.base import Resolver
from twin_resolver.factory import build_resolver
from twin_resolver.static import TwinFileError
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger("msgbusd.gateway")

DEFAULT_LISTEN_HOST = "127.0.0.1"
DEFAULT_LISTEN_PORT = 8080
# Connecting to a node is given at most this long, within the whole request's timeout.
CONNECT_TIMEOUT_S = 5.0


class GatewayStartupError(Exception):
    """A reason the gateway cannot start, worded for the operator (one line)."""


@dataclass(frozen=True)
class GatewaySettings:
    """Everything ``msgbus gateway`` can be told."""

    twins_file: Path | None = None
    substrate_url: str | None = None
    listen_host: str = DEFAULT_LISTEN_HOST
    listen_port: int = DEFAULT_LISTEN_PORT
    node_timeout_s: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    cors_origins: tuple[str, ...] = ("*",)
    drain_grace_s: float = 5.0
    # Off for tests and embedding: whoever runs the loop owns the signals.
    handle_signals: bool = True


def open_resolver(settings: GatewaySettings) -> Resolver:
    """The twin map when given, else the chain (ws/wss) or an HTTP twin source behind a cache."""
    try:
        return build_resolver(settings.substrate_url, settings.twins_file)
    except (TwinFileError, ValueError) as exc:
        raise GatewayStartupError(str(exc)) from exc


def open_node_client(timeout_s: float) -> httpx.AsyncClient:
    """The keep-alive client to twins' daemons; proxies from the environment are not used."""
    # Without TCP_NODELAY a request written in two parts (headers, body) waits for the peer's delayed ACK.
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=60),
    )
    timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)


async def serve_gateway(settings: GatewaySettings) -> None:
    """Serve until stopped by a signal. Raises :class:`GatewayStartupError` for operator mistakes."""
    resolver = open_resolver(settings)
    try:
        sock = bind_socket(settings.listen_host, settings.listen_port)
    except StartupError as exc:
        await resolver.aclose()
        raise GatewayStartupError(str(exc)) from exc
    http = open_node_client(settings.node_timeout_s)
    app = create_gateway_app(
        Nodes(http, resolver), max_body_bytes=settings.max_body_bytes, cors_origins=settings.cors_origins
    )
    server = quiet_server(app, settings.drain_grace_s)
    loop = asyncio.get_running_loop()
    if settings.handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop, server)
    try:
        async with asyncio.TaskGroup() as group:
            serving = group.create_task(server.serve(sockets=[sock]), name="gateway http")
            group.create_task(_announce_ready(server, serving, settings), name="gateway ready")
    finally:
        if settings.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        sock.close()
        await http.aclose()
        await resolver.aclose()
        log.info("msgbus gateway stopped")


def _stop(server: uvicorn.Server) -> None:
    if server.should_exit:
        log.warning("second stop signal: closing open connections now")
        server.force_exit = True
    else:
        log.info("stopping: no new connections; requests in flight may finish")
        server.should_exit = True


async def _announce_ready(
    server: uvicorn.Server, serving: asyncio.Task[None], settings: GatewaySettings
) -> None:
    while not server.started:
        if serving.done():
            return
        await asyncio.sleep(0.01)
    host = f"[{settings.listen_host}]" if ":" in settings.listen_host else settings.listen_host
    source = settings.twins_file or settings.substrate_url
    log.info(
        "msgbus gateway ready: listening on http://%s:%s, twins from %s", host, settings.listen_port, source
    )


def run_gateway(settings: GatewaySettings) -> None:
    """Run the gateway in a fresh event loop (uvloop when installed) until it is stopped."""
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_gateway(settings))
