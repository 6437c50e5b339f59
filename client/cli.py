"""The ``msgbus`` command: send requests, wait for replies, serve a command with a program, show an identity,
show a site's status.

Exit status: 0 success; 1 a reply carries an error; 2 timeout or bad usage; 3 Redis unreachable or full (or
the twin source unreachable), or an undecodable reply; 4 a missing optional dependency. ``msgbus status``
has its own: 0 healthy, 1 degraded, 2 unreachable.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

from client.cli_common import (
    EXIT_MISSING_DEP,
    EXIT_REDIS,
    EXIT_REPLY_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    fail,
    redact,
    redis_errors,
)
from client.errors import ProtocolError
from client.protocol import DEFAULT_REDIS_URL, DEFAULT_RETRIES
from client.replies import CallTimeout, Reply
from client.serve_exec import exec_handler
from client.service import Service
from client.status import DEFAULT_SITE_URL, DEFAULT_TIMEOUT_S, open_redis
from client.status_command import show_status
from client.sync import Client
from wire.redis_url import sync_client

app = typer.Typer(
    name="msgbus",
    help="Talk to the message bus through the local site's Redis.\n\n"
    "Exit status: 0 ok; 1 a reply carries an error; 2 timeout or bad usage; 3 Redis unreachable or full, or "
    "an undecodable reply.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

RedisOption = Annotated[
    str, typer.Option("--redis", metavar="URL", envvar="MSGBUS_REDIS", help="Redis URL of the local site.")
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        min=0,
        metavar="SECONDS",
        help="Seconds to wait for replies [default: the request's lifetime].",
    ),
]


class KeyType(StrEnum):
    """Signature schemes a site identity can use."""

    sr25519 = "sr25519"
    ed25519 = "ed25519"


@app.command()
def send(
    dst: Annotated[
        list[int], typer.Option("--dst", min=1, metavar="TWIN", help="Destination twin (repeatable).")
    ],
    cmd: Annotated[str, typer.Option("--cmd", metavar="CMD", help="Command to call on the twins.")],
    data: Annotated[
        str | None, typer.Option("--data", metavar="TEXT", help="Payload [default: stdin].")
    ] = None,
    exp: Annotated[
        int, typer.Option("--exp", min=0, metavar="SECONDS", help="Request lifetime (0: 3600).")
    ] = 0,
    retries: Annotated[
        int, typer.Option("--try", min=0, metavar="N", help="Delivery retries.")
    ] = DEFAULT_RETRIES,
    timeout: TimeoutOption = None,
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Call CMD on each --dst twin and print one JSON line per reply, in the order of --dst."""
    if data is None and sys.stdin.isatty():
        typer.echo("reading the payload from stdin (end it with Ctrl-D)", err=True)
    payload = data.encode() if data is not None else sys.stdin.buffer.read()
    with _client(redis_url) as client:
        _print_replies(lambda: client.call(dst, cmd, payload, exp=exp, retries=retries, timeout=timeout))


@app.command()
def wait(
    ret: Annotated[str, typer.Argument(metavar="RET", help="Return queue of the request.")],
    count: Annotated[int, typer.Option("--count", min=1, metavar="N", help="Replies to wait for.")] = 1,
    timeout: TimeoutOption = None,
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Pop COUNT replies from the return queue RET and print one JSON line per reply, in arrival order."""
    with _client(redis_url) as client:
        _print_replies(lambda: client.wait(ret, count, timeout=timeout))


@app.command()
def serve(
    cmd: Annotated[str, typer.Argument(metavar="CMD", help="Command to serve (from the list msgbus.CMD).")],
    program: Annotated[str, typer.Option("--exec", metavar="PROGRAM", help="Program run per request.")],
    workers: Annotated[int, typer.Option("--workers", min=1, metavar="N", help="Concurrent requests.")] = 1,
    burst: Annotated[bool, typer.Option("--burst", help="Exit once the queue is empty.")] = False,
    name: Annotated[
        str,
        typer.Option(
            "--name", help="This service's name; give each process serving CMD its own (crash recovery)."
        ),
    ] = "default",
    redis_url: RedisOption = DEFAULT_REDIS_URL,
) -> None:
    """Serve CMD: run PROGRAM (shell-like split, no shell) per request, payload on stdin.

    Its stdout is the reply; a non-zero exit replies with its stderr as the error.
    """
    try:
        handler = exec_handler(shlex.split(program))
    except (ValueError, FileNotFoundError) as exc:
        fail(f"--exec: {exc}", EXIT_USAGE)
    with _client(redis_url) as client:
        client.ping()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(redis_url, workers=workers, name=name)
    service.register(cmd, handler)
    with redis_errors(redis_url):
        service.run(burst=burst)


@app.command()
def identity(
    mnemonics: Annotated[
        str | None,
        typer.Option(
            "--mnemonics", metavar="TEXT", envvar="MSGBUS_MNEMONICS", help="Secret phrase, SURI or 0x seed."
        ),
    ] = None,
    key_type: Annotated[KeyType, typer.Option("--key-type", help="Signature scheme.")] = KeyType.sr25519,
    new: Annotated[bool, typer.Option("--new", help="Make a new mnemonic (printed too).")] = False,
    substrate: Annotated[
        str | None,
        typer.Option(
            "--substrate",
            metavar="URL",
            help="Also look up the twin registered for this key on TFChain (ws:// or wss://).",
        ),
    ] = None,
) -> None:
    """Print the public key (hex), SS58 address and encryption key (pk, for the twin map) of a site identity
    (and its twin, with --substrate)."""
    try:
        from msgbusd.identity import keys as ident
        from twin_resolver.accounts import ss58_encode
    except ImportError as exc:
        fail(f"identity needs the daemon extra (pip install 'msgbus[daemon]'): {exc}", EXIT_MISSING_DEP)
    if new and mnemonics:
        fail("give either --new or --mnemonics, not both", EXIT_USAGE)
    if new:
        mnemonics = ident.new_mnemonic()
        typer.echo(f"mnemonic:   {mnemonics}")
    if not mnemonics:
        fail("give --mnemonics (or set MSGBUS_MNEMONICS), or --new", EXIT_USAGE)
    try:
        signer = ident.load_signer(mnemonics, key_type.value)
    except ident.IdentityError as exc:
        fail(str(exc), EXIT_USAGE)
    typer.echo(f"key type:   {key_type.value}")
    typer.echo(f"public key: {signer.public_key.hex()}")
    typer.echo(f"address:    {ss58_encode(signer.public_key)}")
    # What other sites encrypt for this one through a relay: the twin entry's "pk" (an ed25519 account's
    # converted key is the same, so such a twin needs no pk).
    typer.echo(f"pk:         {bytes(signer.encryption_key().public_key).hex()}")
    if substrate is not None:
        typer.echo(f"twin:       {_registered_twin(substrate, signer.public_key)}")


def _registered_twin(substrate: str, public_key: bytes) -> int:
    import asyncio

    from twin_resolver import ResolverError, build_resolver

    try:
        resolver = build_resolver(substrate, None)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)

    async def look_up() -> int:
        try:
            return await resolver.twin_id_by_public_key(public_key)
        finally:
            await resolver.aclose()

    try:
        return asyncio.run(look_up())
    except ResolverError as exc:
        fail(f"no twin for this key at {substrate}: {exc}", EXIT_REDIS)


@app.command()
def demo(
    event_log: Annotated[
        Path | None,
        typer.Option(
            "--event-log",
            metavar="DIR",
            help="Have both sites write their event logs to DIR (and send more traffic), for msgbus mine.",
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the sites up and serving after the demo, until Ctrl-C.")
    ] = False,
) -> None:
    """Start two local sites, serve an echo command and show requests, errors and the proxy flow."""
    try:
        from client.demo import run_demo
    except ImportError as exc:
        fail(f"the demo needs the daemon: pip install 'msgbus[daemon]' ({exc})", EXIT_MISSING_DEP)
    try:
        run_demo(typer.echo, event_log, keep=keep)
    except KeyboardInterrupt:
        typer.echo("interrupted; everything the demo started has been stopped", err=True)
        raise typer.Exit(130) from None


@app.command()
def gateway(
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="Where HTTP clients reach the gateway; loopback only unless told otherwise "
            "(e.g. [::]:8080 for every address).",
        ),
    ] = "127.0.0.1:8080",
    twins: Annotated[
        Path | None, typer.Option("--twins", metavar="FILE", help="Twin map (JSON) to find the twins in.")
    ] = None,
    substrate: Annotated[
        str | None,
        typer.Option(
            "--substrate",
            metavar="URL",
            help="Or look twins up on TFChain (ws://, wss://) or an HTTP twin source (http(s)://); "
            "not used with --twins.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, metavar="SECONDS", help="Time a node has to answer.")
    ] = 10.0,
    max_body_mib: Annotated[
        float, typer.Option("--max-body-mib", min=0.001, metavar="MIB", help="Largest request body accepted.")
    ] = 12.0,
    cors_origins: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            metavar="ORIGIN",
            help="Browser origin allowed to call the gateway (repeatable) [default: * (any)].",
        ),
    ] = None,
    drain_grace: Annotated[
        float,
        typer.Option("--drain-grace", min=0, metavar="SECONDS", help="On SIGTERM, time to finish requests."),
    ] = 5.0,
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL", help="debug, info, warn, error, fatal or panic.")
    ] = "info",
) -> None:
    """Serve RMB's HTTP proxy endpoints (POST /twin/{id}, POST /twin/{id}/{retqueue}) for HTTP clients
    without a site of their own, such as the npm ts-rmb-http-client. Needs --twins or --substrate.

    Start-up problems (no twin source, an unreadable twin map, a port in use) exit with status 2.
    """
    try:
        from msgbusd.gateway.runner import GatewaySettings, GatewayStartupError, run_gateway
        from msgbusd.reports.logs import configure_logging
        from msgbusd.site.cli import LOG_LEVELS, parse_listen
    except ImportError as exc:
        fail(f"the gateway needs the daemon extra: pip install 'msgbus[daemon]' ({exc})", EXIT_MISSING_DEP)
    level = LOG_LEVELS.get(log_level.lower())
    if level is None:
        fail(f"unknown log level {log_level!r}: use {', '.join(LOG_LEVELS)}", EXIT_USAGE)
    if twins is None and not substrate:
        fail("no twin source: give a twin map (--twins FILE) or --substrate URL", EXIT_USAGE)
    try:
        host, port = parse_listen(listen)
    except typer.BadParameter as exc:
        fail(f"--listen: {exc}", EXIT_USAGE)
    settings = GatewaySettings(
        twins_file=twins,
        substrate_url=substrate,
        listen_host=host,
        listen_port=port,
        node_timeout_s=timeout,
        max_body_bytes=max(1, int(max_body_mib * 1024 * 1024)),
        cors_origins=tuple(cors_origins or ["*"]),
        drain_grace_s=drain_grace,
    )
    configure_logging(level)
    try:
        run_gateway(settings)
    except GatewayStartupError as exc:
        fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command()
def status(
    redis_url: RedisOption = DEFAULT_REDIS_URL,
    site_url: Annotated[
        str,
        typer.Option(
            "--site",
            metavar="URL",
            envvar="MSGBUS_SITE",
            help="The site's daemon, on this machine (its /status answers loopback clients only).",
        ),
    ] = DEFAULT_SITE_URL,
    watch: Annotated[
        float | None,
        typer.Option("--watch", min=0.1, metavar="SECONDS", help="Show it again every SECONDS until Ctrl-C."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object (one per line with --watch).")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.1, metavar="SECONDS", help="Time Redis and the daemon have to answer."
        ),
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Show the site's health: its twin and version, Redis and its memory, queue depths, the backlog,
    overdue requests, dead letters, each peer's state and queue, and the last minute's traffic.

    Exit status: 0 healthy; 1 degraded (a peer down, overdue requests, recent dead letters, Redis full or
    evicting, a problem the daemon reports); 2 unreachable (Redis or the daemon does not answer) or bad
    usage.
    """
    try:
        open_redis(redis_url, timeout).close()
    except ValueError as exc:
        fail(f"invalid Redis URL {redact(redis_url)!r}: {exc}", EXIT_USAGE)
    if urlsplit(site_url).scheme not in ("http", "https"):
        fail(f"--site: {site_url!r} is not an http:// or https:// URL", EXIT_USAGE)
    code = show_status(
        redis_url,
        site_url,
        as_json=as_json,
        watch_s=watch,
        timeout_s=timeout,
        out=sys.stdout,
        environ=os.environ,
    )
    raise typer.Exit(code)


backlog_app = typer.Typer(
    help="Look at what is pending at this site.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(backlog_app, name="backlog")
# Commands of other installed parts (the rules router's `msgbus rules`).
for _entry in entry_points(group="msgbus.commands"):
    app.add_typer(_entry.load(), name=_entry.name)


@backlog_app.command("dump")
def backlog_dump(redis_url: RedisOption = DEFAULT_REDIS_URL) -> None:
    """Print one JSON line per pending entry (requests awaiting replies, scheduled re-sends, replies being
    forwarded, queued items, dead letters), with ages and deadlines; `msgbus mine --backlog` reads them."""

    from client.backlog_dump import dump

    with redis_errors(redis_url):
        try:
            redis = sync_client(redis_url)
        except ValueError as exc:
            fail(f"invalid Redis URL {redact(redis_url)!r}: {exc}", EXIT_USAGE)
        with redis:
            count = dump(redis, sys.stdout)
    typer.echo(f"{count} pending entries", err=True)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def mine(ctx: typer.Context) -> None:
    """Mine event logs and backlog snapshots with Spark: --events PATH... [--backlog PATH...] --out DIR
    [--master local[*]] [--since ISO] [--until ISO]; or follow a running site: --follow --events DIR --out
    DIR (`msgbus mine --help` for all)."""
    try:
        from spark.mine import main as mine_main
    except ImportError as exc:
        fail(f"msgbus mine needs PySpark: pip install 'msgbus[spark]' ({exc})", EXIT_MISSING_DEP)
    raise typer.Exit(mine_main(list(ctx.args)))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``msgbus`` console script."""
    app(args=None if argv is None else list(argv), prog_name="msgbus")


def _print_replies(fetch: Callable[[], list[Reply]]) -> None:
    try:
        replies = fetch()
    except CallTimeout as exc:
        _echo_replies(exc.replies)
        late = exc.expected - len(exc.replies)
        fail(f"{exc}; fetch late replies with: msgbus wait {exc.ret} --count {late}", EXIT_TIMEOUT)
    except ProtocolError as exc:
        fail(f"undecodable reply: {exc}", EXIT_REDIS)
    except (ValueError, TypeError) as exc:
        fail(str(exc), EXIT_USAGE)
    _echo_replies(replies)
    if any(reply.error for reply in replies):
        raise typer.Exit(EXIT_REPLY_ERROR)


def _echo_replies(replies: Sequence[Reply]) -> None:
    for reply in replies:
        typer.echo(json.dumps(reply.to_dict(), ensure_ascii=False))


@contextmanager
def _client(redis_url: str) -> Iterator[Client]:
    try:
        client = Client(redis_url)
    except ValueError as exc:
        fail(f"invalid Redis URL {redact(redis_url)!r}: {exc}", EXIT_USAGE)
    with client, redis_errors(redis_url):
        yield client
