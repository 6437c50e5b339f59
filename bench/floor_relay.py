"""The benchmark's floor: the same hops as msgbusd (Redis pops and pushes, one HTTP POST each way) with no
daemon logic at all: no signatures, no backlog, no retries, no de-duplication, no crash safety.

What a round trip costs on this machine with the same libraries, to say how close msgbusd comes to it.

    python -m bench.floor_relay REDIS_URL PORT PEER_URL
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import cast

import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from msgbusd.link.http_client import HttpClients
from wire import keys

IN_FLIGHT = 256


def make_app(conn: aioredis.Redis) -> Starlette:
    async def inbound(request: Request) -> Response:
        body = await request.body()
        await conn.lpush(keys.command_queue(json.loads(body)["cmd"]), body)
        return Response(b'{"status": "accepted"}')

    async def outbound(request: Request) -> Response:
        body = await request.body()
        await conn.lpush(json.loads(body)["ret"], body)
        return Response(b'{"status": "accepted"}')

    return Starlette(
        routes=[Route("/in", inbound, methods=["POST"]), Route("/out", outbound, methods=["POST"])]
    )


async def relay(conn: aioredis.Redis, http: HttpClients, queue: str, url: str) -> None:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def forward(body: bytes) -> None:
        try:
            await http.request("POST", url, content=body)
        finally:
            slots.release()

    tasks: set[asyncio.Task[None]] = set()
    while True:
        await slots.acquire()
        item = await conn.blpop([queue], timeout=1)
        if item is None:
            slots.release()
            continue
        task = asyncio.create_task(forward(cast(bytes, item[1])))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def main(redis_url: str, port: int, peer: str) -> None:
    conn = aioredis.Redis.from_url(redis_url, socket_timeout=10, max_connections=512)
    # The HTTP client msgbusd uses between sites.
    http = HttpClients(10.0, per_origin=IN_FLIGHT)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(make_app(conn), log_level="warning", lifespan="off"))
    # Runs until the benchmark ends it (SIGTERM: uvicorn stops serving and the process exits).
    relays = [
        asyncio.create_task(relay(conn, http, keys.LOCAL, f"{peer}/in")),
        asyncio.create_task(relay(conn, http, keys.REPLY, f"{peer}/out")),
    ]
    await server.serve(sockets=[sock])
    for task in relays:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
