"""How fast a :class:`client.Service` answers a queue of requests: N requests pushed as the daemon delivers
them, then served in burst mode by W workers, with an async handler and with a plain (threaded) one.
Prints one JSON line per handler kind: requests per second, Redis commands per request, CPU per request.

    python -m bench.service [N] [W]
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

import redis.asyncio as aioredis

from client import Request, Service
from testing.local_sites import RedisProcess
from wire import keys
from wire.envelope import Envelope, encode_payload

CMD = "bench.echo"


def requests(count: int) -> list[bytes]:
    return [
        Envelope(
            uid=f"2.{n}",
            cmd=CMD,
            exp=300,
            dat=encode_payload(b"x" * 64),
            src=1,
            dst=(2,),
            ret=keys.REPLY,
            now=int(time.time()),
        ).encode()
        for n in range(count)
    ]


async def echo(request: Request) -> bytes:
    return request.data


def echo_in_thread(request: Request) -> bytes:
    return request.data


async def commands(conn: aioredis.Redis) -> int:
    return int((await conn.info("stats"))["total_commands_processed"])


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_run(url: str, count: int, workers: int, kind: str) -> dict[str, object]:
    conn = aioredis.Redis.from_url(url)
    await conn.flushall()
    queue = keys.command_queue(CMD)
    items = requests(count)
    for start in range(0, count, 1000):
        await conn.lpush(queue, *items[start : start + 1000])
    service = Service(url, workers=workers)
    service.register(CMD, echo if kind == "async" else echo_in_thread)
    commands_before, cpu_before = await commands(conn), cpu_s()
    started = time.perf_counter()
    await service.serve(burst=True)
    elapsed = time.perf_counter() - started
    # INFO itself counts as a command: leave it out.
    used = await commands(conn) - commands_before - 1
    cpu = cpu_s() - cpu_before
    answered = await conn.llen(keys.REPLY)
    await conn.aclose()
    return {
        "handler": kind,
        "requests": count,
        "workers": workers,
        "answered": answered,
        "requests_per_s": round(count / elapsed),
        "redis_commands_per_request": round(used / count, 2),
        "cpu_ms_per_request": round(1000 * cpu / count, 3),
    }


async def main(count: int, workers: int) -> None:
    server = RedisProcess().start()
    try:
        for kind in ("async", "thread"):
            print(json.dumps(await one_run(server.url, count, workers, kind)), flush=True)
    finally:
        server.cleanup()


if __name__ == "__main__":
    asyncio.run(
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000, int(sys.argv[2]) if len(sys.argv) > 2 else 8)
    )
