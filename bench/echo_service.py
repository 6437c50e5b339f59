"""The benchmark's service: R asyncio workers that pop ``msgbus.<cmd>``, swap src/dst and push the reply.

This is what a zos service does (BRPOP, reply to ``msgbus.system.reply`` without a signature), so the
figures compare with go-rmb's measured with the same kind of service.

    python -m bench.echo_service REDIS_URL CMD WORKERS
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import redis.asyncio as aioredis

from wire import keys
from wire.envelope import Envelope


async def worker(conn: aioredis.Redis, queue: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        item = await conn.brpop([queue], timeout=1)
        if item is None:
            continue
        request = Envelope.decode(item[1])
        reply = request.replace(src=request.dst[0], dst=(request.src,), sig="")
        await conn.lpush(keys.REPLY, reply.encode())


async def main(redis_url: str, cmd: str, workers: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    conns = [aioredis.Redis.from_url(redis_url, socket_timeout=10) for _ in range(workers)]
    try:
        await asyncio.gather(*(worker(conn, keys.command_queue(cmd), stop) for conn in conns))
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
