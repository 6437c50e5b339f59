"""The command line, ``python -m testing.many_twins``: the options, serving the twins until SIGTERM or
SIGINT (on uvloop when it is installed), and the totals on stdout as the stats line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from testing import many_twins
from testing.many_twins.counts import Counts
from testing.many_twins.endpoints import Settings
from testing.many_twins.server import STATS_LINE, serve
from testing.many_twins.twins import TwinRange


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        twins = TwinRange.of(args.first, args.count, args.down, args.down_ids)
    except ValueError as exc:
        raise SystemExit(f"many_twins: {exc}") from None
    settings = Settings(
        twins=twins,
        twins_file=args.twins,
        port=args.port,
        down_port=args.down_port,
        links=args.links,
        reply_bytes=args.reply_bytes,
        freshness_s=args.freshness,
        timeout_s=args.timeout,
        reply_workers=args.reply_workers,
        reply_tries=args.reply_tries,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        counts = runner.run(_run_until_signalled(settings))
    _print(f"{STATS_LINE}: {json.dumps(counts.as_json(twins, 0))}")


async def _run_until_signalled(settings: Settings) -> Counts:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    return await serve(settings, stopping, _print)


def _print(line: str) -> None:
    print(line, flush=True)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def comma_separated_ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testing.many_twins", description=many_twins.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--twins", type=Path, required=True, help="Twin file: the twins are added to it.")
    parser.add_argument("--first", type=int, default=1000, help="The first twin id.")
    parser.add_argument("--count", type=int, default=100, help="How many twins.")
    parser.add_argument("--down", type=int, default=0, help="The last N twins of the range are down.")
    parser.add_argument(
        "--down-ids",
        type=comma_separated_ids,
        default=[],
        help="These twins (ids, comma-separated) are down too.",
    )
    parser.add_argument("--port", type=int, default=0, help="Where the up twins are served (0: any).")
    parser.add_argument("--down-port", type=int, default=0, help="Where the down twins refuse (0: any).")
    parser.add_argument(
        "--no-links", dest="links", action="store_false", help="Answer link upgrades 404: sites POST."
    )
    parser.add_argument("--reply-bytes", type=int, default=None, help="Reply with N bytes, not the echo.")
    parser.add_argument("--freshness", type=float, default=60.0, help="Seconds a request may be old.")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="Seconds a reply POST or a frame may take."
    )
    parser.add_argument("--reply-workers", type=int, default=64, help="Reply POSTs at once.")
    parser.add_argument("--reply-tries", type=int, default=3, help="Tries of a reply a site does not take.")
    parser.add_argument("--log-level", default="warning", help="debug|info|warning|error.")
    return parser


if __name__ == "__main__":
    main()
