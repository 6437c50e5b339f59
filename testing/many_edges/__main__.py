"""The command line, ``python -m testing.many_edges``: the options, running the edges until SIGTERM or
SIGINT (on uvloop when it is installed), and the totals on stdout as the stats line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from testing.many_edges.server import Settings, serve, stats_text

STATS_LINE = "many-edges stats"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testing.many_edges", description=__doc__)
    parser.add_argument(
        "--cloud", type=int, required=True, help="the cloud site's twin, which the edges dial"
    )
    parser.add_argument("--twins", type=Path, required=True, help="the twin file (the edges are added to it)")
    parser.add_argument("--first", type=int, default=100_000, help="the first edge's twin id")
    parser.add_argument("--count", type=int, default=1000, help="how many edges")
    parser.add_argument("--port", type=int, required=True, help="where the counts are served (loopback)")
    parser.add_argument("--timeout", type=float, default=10.0, help="a send, a dial or a handshake at most")
    parser.add_argument("--ping", type=float, default=5.0, help="the uplinks' ping interval (--link-ping)")
    parser.add_argument(
        "--reply-bytes", type=int, help="answer with this many bytes (default: the request's)"
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = Settings(
        cloud=args.cloud,
        first=args.first,
        count=args.count,
        twins_file=args.twins,
        port=args.port,
        timeout_s=args.timeout,
        ping_s=args.ping,
        reply_bytes=args.reply_bytes,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_run(settings))


async def _run(settings: Settings) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    edges = await serve(settings, stopping, lambda line: print(line, flush=True))
    print(f"{STATS_LINE}: {stats_text(edges)}", flush=True)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    main()
