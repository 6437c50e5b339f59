"""Serving the twins: the loopback sockets (one that serves every up twin, one that refuses every down
twin), the twins added to the twin file, the endpoints served until told to stop, and the ready line saying
where once they take requests (:data:`READY_LINE`; the command's :data:`STATS_LINE` is kept beside it)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from aiohttp import web

from msgbusd.link.http_client import HttpClients
from testing.many_twins.counts import Counts
from testing.many_twins.endpoints import ManyTwins, Settings
from testing.many_twins.twins import CONTROL_HOST, add_to_twin_file, twin_entries, twin_signer
from twin_resolver.static import StaticResolver

READY_LINE = "many-twins ready"
STATS_LINE = "many-twins stats"


async def serve(settings: Settings, stopping: asyncio.Event, on_ready: Callable[[str], None]) -> Counts:
    """Serve the twins until ``stopping`` is set; ``on_ready`` gets a line saying where, once they take
    requests. Returns the counts."""
    twins = settings.twins
    listener = _loopback_socket(settings.port)
    # Bound and never listening: a connection to it is refused, and no other server can take the port.
    refuser = _loopback_socket(settings.down_port)
    try:
        signers = {twin: twin_signer(twin) for twin in twins.ids}
        port, down_port = listener.getsockname()[1], refuser.getsockname()[1]
        add_to_twin_file(settings.twins_file, twin_entries(twins, port, down_port, signers))
        http = HttpClients(settings.timeout_s, per_origin=settings.reply_workers)
        harness = ManyTwins(settings, signers, StaticResolver(settings.twins_file), http)
        runner = web.AppRunner(harness.app(), access_log=None, shutdown_timeout=settings.timeout_s)
        await runner.setup()
        try:
            await web.SockSite(runner, listener, backlog=4096).start()
            on_ready(
                f"{READY_LINE}: http://{CONTROL_HOST}:{port}, twins {twins.first}-{twins.ids[-1]} "
                f"({len(twins.down)} down, refused on port {down_port}), twin file {settings.twins_file}"
            )
            async with asyncio.TaskGroup() as group:
                workers = [group.create_task(harness.post_replies()) for _ in range(settings.reply_workers)]
                await stopping.wait()
                await harness.close_links()
                await harness.drain(settings.timeout_s)
                for worker in workers:
                    worker.cancel()
        finally:
            await runner.cleanup()
            await http.aclose()
        return harness.counts
    finally:
        listener.close()
        refuser.close()


def _loopback_socket(port: int) -> socket.socket:
    """A socket on ``port`` of every loopback address, and of nothing else (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        raise
    return sock
