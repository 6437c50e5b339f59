"""Compiled libraries against what the daemon uses now on its hottest work, side by side in one run: CPU time
per operation (``time.process_time`` over many calls), the candidates taking turns over several rounds;
reported per candidate: the median and the spread (min-max) over the rounds, and the ratio to the current one.

- ``envelope``: decoding one signed RMB envelope from bytes (and checking it), and encoding it:
  ``wire.envelope.Envelope`` against a ``msgspec.Struct`` of the same fields (``msgspec.json.Decoder``).
- ``websocket``: a 600-byte frame echoed over a loopback WebSocket, one at a time: aiohttp's client to a
  uvicorn/starlette server, as the two ends of a link are built, against picows at both ends (its core API,
  and its websockets-like API); the CPU of the client (this process) and of the server (a process of its own,
  read from /proc) per round trip, and the latency's median.
- ``redis``: a GET, an EVALSHA with a 600-byte argument and a pipeline of 8 of them, against a redis-server
  of its own: redis-py's asyncio client, made as the daemon makes it, against coredis and valkey-glide (its
  core in Rust: its threads' CPU is this process's too); the CPU of the client and of redis-server per call.

The candidates are not dependencies of the project; install them in the venv to compare them (any candidate
missing is skipped, with the reason):

    .venv/bin/pip install msgspec picows coredis valkey-glide

    python -m bench.libraries [--only envelope|websocket|redis] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import importlib.util
import operator
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar, cast

import aiohttp
import redis
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from msgbusd.identity.signing import Signer
from msgbusd.link.http_client import HttpClients
from msgbusd.link.site_socket import LINK_PATH, SiteSocket, SiteSocketSettings, site_sockets
from msgbusd.site.daemon import PEER_CONNECTIONS, open_redis
from msgbusd.site.serving import server
from msgbusd.site.settings import Settings
from msgbusd.store.script_batch import ScriptBatch
from testing.local_sites import RedisProcess, free_port, port_open, stop_process, wait_until
from wire.envelope import (
    DEFAULT_MAX_MESSAGE_BYTES,
    INT64_MAX,
    INT64_MIN,
    Envelope,
    EnvelopeDecodeError,
    encode_payload,
    envelope_size_limit,
)
from wire.redis_url import sync_client

if TYPE_CHECKING:
    import coredis
    import glide
    from picows import WSTransport
    from picows.websockets import ClientConnection

DESCRIPTION = "CPU per operation of compiled libraries against what the daemon uses now."
SECTIONS = ("envelope", "websocket", "redis")
ROUNDS = 5
# The daemon's defaults: its settings, and the largest WebSocket message a link takes.
DAEMON = Settings(mnemonics="")
MAX_FRAME_BYTES = envelope_size_limit(DEFAULT_MAX_MESSAGE_BYTES) + 4096
INSTALL_HINT = ".venv/bin/pip install msgspec picows coredis valkey-glide"


# -- Measuring and reporting ------------------------------------------------------------------------------


@dataclass
class Figures:
    """One candidate's figures for one operation, one entry per round (µs per operation)."""

    name: str
    client_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)


def missing_modules(modules: Sequence[str]) -> list[str]:
    return [module for module in modules if importlib.util.find_spec(module) is None]


def skip_unless_installed(name: str, modules: Sequence[str]) -> bool:
    """Whether the candidate ``name`` can run; says why not when it cannot."""
    missing = missing_modules(modules)
    if missing:
        print(f"skipped {name}: {', '.join(missing)} not installed ({INSTALL_HINT})")
    return not missing


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` so far, from /proc (in clock ticks, 10 ms here)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The fields after the command name (which may hold spaces), from field 3 (state) on.
    fields = stat.rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def cpu_us_per_call(call: Callable[[], object], iterations: int) -> float:
    """CPU µs of this process per call of ``call``."""
    gc.collect()
    start = time.process_time()
    for _ in range(iterations):
        call()
    return (time.process_time() - start) / iterations * 1e6


async def measure_awaited(
    call: Callable[[], Awaitable[object]],
    iterations: int,
    server_cpu_s: Callable[[], float] | None,
    into: Figures,
) -> None:
    """Await ``call`` ``iterations`` times, one at a time; add the CPU µs per call of this process and of
    the server (``server_cpu_s``: its CPU seconds so far), and the median latency, to ``into``."""
    latencies_ns = []
    gc.collect()
    server_start = server_cpu_s() if server_cpu_s is not None else 0.0
    start = time.process_time()
    for _ in range(iterations):
        sent = time.perf_counter_ns()
        await call()
        latencies_ns.append(time.perf_counter_ns() - sent)
    into.client_us.append((time.process_time() - start) / iterations * 1e6)
    if server_cpu_s is not None:
        into.server_us.append((server_cpu_s() - server_start) / iterations * 1e6)
    into.latencies_us.append(statistics.median(latencies_ns) / 1e3)


T = TypeVar("T")


def turns(candidates: Sequence[T], rounds: int) -> Iterator[T]:
    """The candidates, round after round, each round starting one further along (no one always first)."""
    for round_number in range(rounds):
        shift = round_number % len(candidates)
        yield from [*candidates[shift:], *candidates[:shift]]


def _figure_columns(values: Sequence[float], current: Sequence[float]) -> str:
    """The median, the spread (min-max) and the ratio of the median to the current one's."""
    median, current_median = statistics.median(values), statistics.median(current)
    spread = f"{median:8.2f} ({min(values):.2f}-{max(values):.2f})"
    ratio = f"{median / current_median:6.2f}" if current_median else f"{'-':>6}"
    return f"{spread:>28} {ratio}"


def print_table(title: str, rows: Sequence[Figures]) -> None:
    """The figures of each candidate; the first row is the current one, which the ratios compare with."""
    current = rows[0]
    header = f"{'candidate':<40} {'client CPU µs/op (min-max)':>28} {'ratio':>6}"
    if current.server_us:
        header += f" {'server CPU µs/op (min-max)':>28} {'ratio':>6}"
    if current.latencies_us:
        header += f" {'p50 µs':>8}"
    print(f"\n{title}\n{header}")
    for row in rows:
        line = f"{row.name:<40} {_figure_columns(row.client_us, current.client_us)}"
        if current.server_us:
            line += f" {_figure_columns(row.server_us, current.server_us)}"
        if current.latencies_us:
            line += f" {statistics.median(row.latencies_us):8.1f}"
        print(line)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop, as the daemon runs on (where it is installed), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_async(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(main())


def envelope_of_size(total_bytes: int) -> bytes:
    """A signed request that encodes to about ``total_bytes``."""
    fields_bytes = len(sample_envelope(0).encode())
    return sample_envelope(max(0, (total_bytes - fields_bytes) * 3 // 4)).encode()


def sample_envelope(payload_bytes: int) -> Envelope:
    """A request as a site sends it: signed (ed25519), with a payload of ``payload_bytes``."""
    request = Envelope(
        uid=str(uuid.uuid4()),
        cmd="bench.echo",
        src=1,
        dst=(2,),
        ret=str(uuid.uuid4()),
        dat=encode_payload(b"x" * payload_bytes),
        exp=60,
        now=int(time.time()),
    )
    return Signer(bytes(range(32)), "ed25519").sign(request)


# -- 1. Envelopes -----------------------------------------------------------------------------------------

ENVELOPE_ITERATIONS = 20_000
_ATTRS = tuple(f.name for f in dataclasses.fields(Envelope))
read_fields = operator.attrgetter(*_ATTRS)
_SLOT_WRITERS = tuple(getattr(Envelope, attr).__set__ for attr in _ATTRS)

# Wire objects the current decoder reads by its rules (case-insensitive keys, null as zero, lone surrogates
# replaced, ...): a candidate must give the same envelope, or the same error.
EDGE_CASES = (
    b"{}",
    b'{"VER":1,"Cmd":"x","DST":[3]}',
    b'{"ver":null,"cmd":null,"dst":null,"pxy":null}',
    b'{"cmd":"x","extra":{"a":1}}',
    b'{"cmd":"a","cmd":"b"}',
    b'{"cmd":"\\ud800x"}',
    b'{"cmd":"\xc3\xa9"}',
    b'{"now":9223372036854775808}',
    b'{"now":-9223372036854775809}',
    b'{"dst":[18446744073709551616]}',
    b'{"exp":"60"}',
    b'{"exp":1.0}',
    b'{"exp":true}',
    b'{"pxy":1}',
    b'{"dst":[1,true]}',
    b"[1,2]",
    b"{",
    b"\xff",
)


@dataclass(frozen=True)
class EnvelopeCodec:
    name: str
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]
    # The value ``encode`` takes for the sample envelope.
    to_encode: Callable[[Envelope], Any]


def current_codec() -> EnvelopeCodec:
    return EnvelopeCodec("Envelope (current)", Envelope.decode, Envelope.encode, lambda env: env)


def msgspec_codecs() -> list[EnvelopeCodec]:
    """msgspec decoding into a Struct of the envelope's fields (its wire names, 64-bit integers, no unknown
    key), and encoding it; a value it refuses is read by the current decoder, whose rules it lacks (it then
    gives the same envelope, or the same error). Two ways: the Struct as the envelope, or an ``Envelope``
    made from it."""
    import msgspec

    int64 = msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)
    wire_envelope = msgspec.defstruct(
        "WireEnvelope",
        [
            ("ver", Annotated[int, int64], 0),
            ("uid", str, ""),
            ("cmd", str, ""),
            ("exp", Annotated[int, int64], 0),
            ("retries", Annotated[int, int64], 0),
            ("dat", str, ""),
            ("src", Annotated[int, int64], 0),
            ("dst", tuple[int, ...], ()),
            ("ret", str, ""),
            ("shm", str, ""),
            ("now", Annotated[int, int64], 0),
            ("pxy", bool, False),
            ("err", str, ""),
            ("sig", str, ""),
        ],
        rename={"retries": "try"},
        frozen=True,
        forbid_unknown_fields=True,
        # No references to other objects: the cycle collector need not track it.
        gc=False,
    )
    decoder = msgspec.json.Decoder(wire_envelope)
    encoder = msgspec.json.Encoder()

    def as_struct(env: Envelope) -> Any:
        return wire_envelope(*read_fields(env))

    def decode_struct(raw: bytes) -> Any:
        try:
            return decoder.decode(raw)
        except msgspec.MsgspecError:
            return as_struct(Envelope.decode(raw))

    def decode_envelope(raw: bytes) -> Envelope:
        try:
            wire = decoder.decode(raw)
        except msgspec.MsgspecError:
            return Envelope.decode(raw)
        env = object.__new__(Envelope)
        for write, value in zip(_SLOT_WRITERS, read_fields(wire), strict=True):
            write(env, value)
        return env

    def encode_envelope(env: Envelope) -> bytes:
        encoded: bytes = encoder.encode(as_struct(env))
        return encoded

    return [
        EnvelopeCodec("msgspec Struct", decode_struct, encoder.encode, as_struct),
        EnvelopeCodec("msgspec Struct -> Envelope", decode_envelope, encode_envelope, lambda env: env),
    ]


def _outcome(decode: Callable[[bytes], Any], raw: bytes) -> object:
    try:
        return read_fields(decode(raw))
    except EnvelopeDecodeError as exc:
        return f"error: {exc.reason}"


def check_same_results(codec: EnvelopeCodec, raw: bytes, env: Envelope) -> None:
    """Raise unless ``codec`` decodes the sample and each edge case as the current decoder does, and encodes
    the sample to the same bytes."""
    for case in (raw, *EDGE_CASES):
        expected, got = _outcome(Envelope.decode, case), _outcome(codec.decode, case)
        if got != expected:
            raise AssertionError(f"{codec.name} decodes {case!r} as {got!r}, not {expected!r}")
    if codec.encode(codec.to_encode(env)) != env.encode():
        raise AssertionError(f"{codec.name} encodes the sample envelope to other bytes")


def bench_envelopes(rounds: int) -> None:
    env = sample_envelope(64)
    raw = env.encode()
    codecs = [current_codec()]
    if skip_unless_installed("msgspec", ["msgspec"]):
        codecs += msgspec_codecs()
    for codec in codecs:
        check_same_results(codec, raw, env)
    decoding = {codec.name: Figures(codec.name) for codec in codecs}
    encoding = {codec.name: Figures(codec.name) for codec in codecs}
    for codec in turns(codecs, rounds):
        value = codec.to_encode(env)
        decode, encode = functools.partial(codec.decode, raw), functools.partial(codec.encode, value)
        decoding[codec.name].client_us.append(cpu_us_per_call(decode, ENVELOPE_ITERATIONS))
        encoding[codec.name].client_us.append(cpu_us_per_call(encode, ENVELOPE_ITERATIONS))
    what = f"one signed envelope of {len(raw)} bytes, {rounds} rounds x {ENVELOPE_ITERATIONS}"
    print(f"\nsame envelope or error as the current decoder on the sample and {len(EDGE_CASES)} edge cases")
    print_table(f"envelope decode + check ({what})", list(decoding.values()))
    print_table(f"envelope encode ({what})", list(encoding.values()))


# -- 2. WebSocket frames ----------------------------------------------------------------------------------

WEBSOCKET_ITERATIONS = 8_000
FRAME_BYTES = 600


async def _starlette_echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        await websocket.send_bytes(message["bytes"])


async def _site_socket_echo(socket: SiteSocket) -> None:
    while (data := await socket.receive()) is not None:
        await socket.send(data)


async def serve_site_socket(port: int) -> None:
    """Echo on ``port`` as a site's port serves links: uvicorn handing the upgrade to the site's own socket
    (:mod:`msgbusd.link.site_socket`)."""
    quiet = server(
        Starlette(),
        DAEMON.drain_grace_s,
        host="127.0.0.1",
        port=port,
        ws=site_sockets(SiteSocketSettings(_site_socket_echo, max_message_bytes=MAX_FRAME_BYTES)),
    )
    await quiet.serve()


async def serve_uvicorn(port: int) -> None:
    """Echo on ``port`` as a site's port served links before its own socket: uvicorn (websockets-sansio)
    pinging every 5 s, a starlette WebSocket route."""
    app = Starlette(routes=[WebSocketRoute(LINK_PATH, _starlette_echo)])
    quiet = server(
        app,
        DAEMON.drain_grace_s,
        host="127.0.0.1",
        port=port,
        ws_max_size=MAX_FRAME_BYTES,
        ws_ping_interval=DAEMON.link_ping_s,
        ws_ping_timeout=2 * DAEMON.link_ping_s,
        ws_per_message_deflate=False,
    )
    await quiet.serve()


async def serve_picows(port: int) -> None:
    """Echo on ``port`` with picows's core API: a listener called with each frame (no message
    reassembly: a fragmented message would come as its frames)."""
    from picows import WSFrame, WSListener, WSMsgType, ws_create_server

    class Echo(WSListener):  # type: ignore[misc,unused-ignore]
        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            if frame.msg_type in (WSMsgType.BINARY, WSMsgType.TEXT):
                transport.send(frame.msg_type, frame.get_payload_as_bytes())
            elif frame.msg_type == WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code(), frame.get_close_message())
                transport.disconnect()

    ws_server = await ws_create_server(
        lambda _request: Echo(),
        "127.0.0.1",
        port,
        enable_auto_ping=True,
        auto_ping_idle_timeout=DAEMON.link_ping_s,
        auto_ping_reply_timeout=DAEMON.link_ping_s,  # at most the idle timeout, for picows
        max_frame_size=MAX_FRAME_BYTES,
    )
    await ws_server.serve_forever()


async def serve_picows_websockets(port: int) -> None:
    """Echo on ``port`` with picows's websockets-like API (whole messages, awaited)."""
    from picows.websockets import ServerConnection, serve

    async def echo(connection: ServerConnection) -> None:
        async for message in connection:
            await connection.send(message)

    async with serve(
        echo,
        "127.0.0.1",
        port,
        compression=None,
        max_size=MAX_FRAME_BYTES,
        ping_interval=DAEMON.link_ping_s,
        ping_timeout=2 * DAEMON.link_ping_s,
    ) as ws_server:
        await ws_server.serve_forever()


SERVERS: dict[str, Callable[[int], Coroutine[Any, Any, None]]] = {
    "site-socket": serve_site_socket,
    "uvicorn": serve_uvicorn,
    "picows": serve_picows,
    "picows-websockets": serve_picows_websockets,
}


@contextlib.contextmanager
def echo_server(kind: str) -> Iterator[tuple[str, int]]:
    """A process serving echo of ``kind`` on a free port: its URL and pid."""
    port = free_port()
    command = [sys.executable, "-m", "bench.libraries", "--serve", kind, "--port", str(port)]
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1])
    try:
        wait_until(lambda: port_open(port), what=f"the {kind} echo server on port {port}")
        yield f"ws://127.0.0.1:{port}{LINK_PATH}", process.pid
    finally:
        stop_process(process)


class EchoClient(Protocol):
    async def echo(self, data: bytes) -> bytes: ...

    async def close(self) -> None: ...


class AiohttpClient:
    """The opener's end of a link: aiohttp, opened as the daemon opens links."""

    def __init__(self, clients: HttpClients, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._clients = clients
        self._ws = ws

    @classmethod
    async def open(cls, url: str) -> AiohttpClient:
        clients = HttpClients(DAEMON.send_timeout_s, per_origin=PEER_CONNECTIONS)
        ws = await clients.websocket(url, max_message_bytes=MAX_FRAME_BYTES, timeout_s=10)
        return cls(clients, ws)

    async def echo(self, data: bytes) -> bytes:
        await self._ws.send_bytes(data)
        message = await self._ws.receive()
        return bytes(message.data)

    async def close(self) -> None:
        await self._ws.close()
        await self._clients.aclose()


class PicowsClient:
    """picows's core API: the reply comes to a listener's callback, which completes the awaited future."""

    def __init__(self, transport: WSTransport, replies: Any, binary: Any) -> None:
        self._transport = transport
        self._replies = replies
        self._binary = binary

    @classmethod
    async def open(cls, url: str) -> PicowsClient:
        from picows import WSFrame, WSListener, WSMsgType, ws_connect

        class Replies(WSListener):  # type: ignore[misc,unused-ignore]
            def __init__(self) -> None:
                super().__init__()
                self.waiting: asyncio.Future[bytes] | None = None

            def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
                if frame.msg_type == WSMsgType.BINARY and self.waiting is not None:
                    self.waiting.set_result(frame.get_payload_as_bytes())
                    self.waiting = None
                elif frame.msg_type == WSMsgType.CLOSE:
                    transport.disconnect()

        transport, replies = await ws_connect(
            Replies,
            url,
            enable_auto_ping=True,
            auto_ping_idle_timeout=DAEMON.link_ping_s,
            auto_ping_reply_timeout=DAEMON.link_ping_s,  # at most the idle timeout, for picows
            max_frame_size=MAX_FRAME_BYTES,
        )
        return cls(transport, replies, WSMsgType.BINARY)

    async def echo(self, data: bytes) -> bytes:
        waiting: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._replies.waiting = waiting
        self._transport.send(self._binary, data)
        return await waiting

    async def close(self) -> None:
        self._transport.send_close()
        self._transport.disconnect()
        await self._transport.wait_disconnected()


class PicowsWebsocketsClient:
    """picows's websockets-like API: ``send`` and ``recv`` awaited, as the daemon's link code reads."""

    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection

    @classmethod
    async def open(cls, url: str) -> PicowsWebsocketsClient:
        from picows.websockets import connect

        connection = await connect(
            url,
            compression=None,
            proxy=None,
            max_size=MAX_FRAME_BYTES,
            ping_interval=DAEMON.link_ping_s,
            ping_timeout=2 * DAEMON.link_ping_s,
        )
        return cls(connection)

    async def echo(self, data: bytes) -> bytes:
        await self._connection.send(data)
        return cast(bytes, await self._connection.recv())

    async def close(self) -> None:
        await self._connection.close()


@dataclass(frozen=True)
class WebSocketCandidate:
    name: str
    server_kind: str
    open_client: Callable[[str], Awaitable[EchoClient]]
    requires: tuple[str, ...] = ()


WEBSOCKET_CANDIDATES = (
    WebSocketCandidate("aiohttp -> the site's socket (current)", "site-socket", AiohttpClient.open),
    WebSocketCandidate("aiohttp -> uvicorn/starlette (before)", "uvicorn", AiohttpClient.open),
    WebSocketCandidate("picows -> picows (core API)", "picows", PicowsClient.open, ("picows",)),
    WebSocketCandidate(
        "picows -> picows (websockets API)", "picows-websockets", PicowsWebsocketsClient.open, ("picows",)
    ),
)


async def _measure_echoes(
    servers: dict[str, tuple[str, int]], candidates: Sequence[WebSocketCandidate], rounds: int, frame: bytes
) -> list[Figures]:
    figures = {candidate.name: Figures(candidate.name) for candidate in candidates}
    clients: dict[str, EchoClient] = {}
    try:
        for candidate in candidates:
            client = clients[candidate.name] = await candidate.open_client(servers[candidate.name][0])
            if await client.echo(frame) != frame:
                raise AssertionError(f"{candidate.name} did not echo the frame")
            # Warm up, not counted.
            await measure_awaited(functools.partial(client.echo, frame), 500, None, Figures(candidate.name))
        for candidate in turns(candidates, rounds):
            echo = functools.partial(clients[candidate.name].echo, frame)
            server_cpu = functools.partial(process_cpu_s, servers[candidate.name][1])
            await measure_awaited(echo, WEBSOCKET_ITERATIONS, server_cpu, figures[candidate.name])
    finally:
        for client in clients.values():
            await client.close()
    return list(figures.values())


def bench_websocket(rounds: int) -> None:
    candidates = [c for c in WEBSOCKET_CANDIDATES if skip_unless_installed(c.name, c.requires)]
    frame = envelope_of_size(FRAME_BYTES)
    with contextlib.ExitStack() as stack:
        servers = {c.name: stack.enter_context(echo_server(c.server_kind)) for c in candidates}
        figures: list[Figures] = []

        async def measure() -> None:
            figures.extend(await _measure_echoes(servers, candidates, rounds, frame))

        run_async(measure)
    print_table(
        f"WebSocket echo of a {len(frame)}-byte frame, one at a time ({rounds} rounds x "
        f"{WEBSOCKET_ITERATIONS}; server CPU from /proc, 10 ms ticks)",
        figures,
    )


# -- 3. Redis ---------------------------------------------------------------------------------------------

SMALL_KEY = "bench:libraries:small"
SMALL_VALUE = b"0123456789abcdef"
SCRIPT_KEY = "bench:libraries:script"
# A small script, as the daemon's are: store the argument, answer its length.
SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]) return string.len(ARGV[1])"
PIPELINE_CALLS = 8
REDIS_ITERATIONS = {"GET": 4_000, "EVALSHA": 4_000, f"pipeline of {PIPELINE_CALLS} EVALSHA": 1_000}


@dataclass(frozen=True)
class RedisCalls:
    """One client's way to make each call; ``close`` closes the client."""

    get: Callable[[], Awaitable[object]]
    script: Callable[[], Awaitable[object]]
    pipeline: Callable[[], Awaitable[object]]
    close: Callable[[], Awaitable[object]]

    def by_operation(self) -> dict[str, Callable[[], Awaitable[object]]]:
        return dict(zip(REDIS_ITERATIONS, (self.get, self.script, self.pipeline), strict=True))


async def redis_py_calls(redis_server: RedisProcess, argument: bytes, sha: str) -> RedisCalls:
    """redis-py's asyncio client as the daemon opens it (hiredis, no socket timeout, a blocking pool); a
    script called through its registered object, and batches as the daemon's ``ScriptBatch`` sends them."""
    client = open_redis(dataclasses.replace(DAEMON, redis_url=redis_server.url), DAEMON.redis_connections)
    script = client.register_script(SCRIPT)

    async def pipeline() -> object:
        batch = ScriptBatch(client)
        for _ in range(PIPELINE_CALLS):
            batch.script(script, [SCRIPT_KEY], [argument])
        return await batch.run()

    return RedisCalls(
        get=lambda: client.get(SMALL_KEY),
        script=lambda: script(keys=[SCRIPT_KEY], args=[argument]),
        pipeline=pipeline,
        close=client.aclose,
    )


async def coredis_calls(redis_server: RedisProcess, argument: bytes, sha: str) -> RedisCalls:
    """coredis's client (RESP3, its own parser), with no read timeout either."""
    import coredis

    stack = contextlib.AsyncExitStack()
    client: coredis.Redis[bytes] = await stack.enter_async_context(
        coredis.Redis(
            "127.0.0.1",
            redis_server.port,
            stream_timeout=None,
            connect_timeout=5,
            max_connections=DAEMON.redis_connections,
        )
    )
    script = client.register_script(SCRIPT)

    async def pipeline() -> object:
        async with client.pipeline(transaction=False, raise_on_error=False) as pipe:
            calls = [pipe.evalsha(sha, [SCRIPT_KEY], [argument]) for _ in range(PIPELINE_CALLS)]
        return [await call for call in calls]

    async def call_script() -> object:
        return await script(keys=[SCRIPT_KEY], args=[argument])

    async def get() -> object:
        return await client.get(SMALL_KEY)

    return RedisCalls(get=get, script=call_script, pipeline=pipeline, close=stack.aclose)


async def glide_calls(redis_server: RedisProcess, argument: bytes, sha: str) -> RedisCalls:
    """valkey-glide's asyncio client (its Rust core does the I/O); a script through its ``Script``
    object, a batch of EVALSHA as custom commands (a batch has no script call of its own)."""
    from glide import Batch, GlideClient, GlideClientConfiguration, NodeAddress, Script

    config = GlideClientConfiguration([NodeAddress("127.0.0.1", redis_server.port)], request_timeout=10_000)
    client: glide.GlideClient = await GlideClient.create(config)
    script = Script(SCRIPT)  # type: ignore[no-untyped-call,unused-ignore]

    async def pipeline() -> object:
        batch = Batch(is_atomic=False)
        for _ in range(PIPELINE_CALLS):
            batch.custom_command(["EVALSHA", sha, "1", SCRIPT_KEY, argument])
        return await client.exec(batch, raise_on_error=False)

    async def call_script() -> object:
        return await client.invoke_script(script, keys=[SCRIPT_KEY], args=[argument])

    async def get() -> object:
        return await client.get(SMALL_KEY)

    return RedisCalls(get=get, script=call_script, pipeline=pipeline, close=client.close)


def redis_server_cpu_s(connection: redis.Redis) -> float:
    """redis-server's CPU seconds so far, as it reports them (in µs: finer than the ticks of /proc)."""
    info = connection.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass(frozen=True)
class RedisCandidate:
    name: str
    open_calls: Callable[[RedisProcess, bytes, str], Awaitable[RedisCalls]]
    requires: tuple[str, ...] = ()


REDIS_CANDIDATES = (
    RedisCandidate("redis-py asyncio + hiredis (current)", redis_py_calls),
    RedisCandidate("coredis", coredis_calls, ("coredis",)),
    RedisCandidate("valkey-glide", glide_calls, ("glide",)),
)


async def _check_answers(name: str, calls: RedisCalls, argument: bytes) -> None:
    answers = (await calls.get(), await calls.script(), await calls.pipeline())
    expected = (SMALL_VALUE, len(argument), [len(argument)] * PIPELINE_CALLS)
    if answers != expected:
        raise AssertionError(f"{name} answered {answers!r}, not {expected!r}")


async def _measure_redis(
    redis_server: RedisProcess, candidates: Sequence[RedisCandidate], rounds: int, argument: bytes
) -> dict[str, list[Figures]]:
    loader = open_redis(dataclasses.replace(DAEMON, redis_url=redis_server.url), 1)
    await loader.set(SMALL_KEY, SMALL_VALUE)
    sha = str(await loader.script_load(SCRIPT))
    await loader.aclose()
    figures = {op: {c.name: Figures(c.name) for c in candidates} for op in REDIS_ITERATIONS}
    opened: dict[str, RedisCalls] = {}
    # Asked on a connection of its own, between the measured calls.
    info_connection = sync_client(redis_server.url)
    server_cpu = functools.partial(redis_server_cpu_s, info_connection)
    try:
        for candidate in candidates:
            calls = opened[candidate.name] = await candidate.open_calls(redis_server, argument, sha)
            await _check_answers(candidate.name, calls, argument)
        for candidate in turns(candidates, rounds):
            for op, call in opened[candidate.name].by_operation().items():
                await measure_awaited(call, REDIS_ITERATIONS[op], server_cpu, figures[op][candidate.name])
    finally:
        for calls in opened.values():
            await calls.close()
        info_connection.close()
    return {op: list(by_name.values()) for op, by_name in figures.items()}


def bench_redis(rounds: int) -> None:
    candidates = [c for c in REDIS_CANDIDATES if skip_unless_installed(c.name, c.requires)]
    argument = envelope_of_size(FRAME_BYTES)
    redis_server = RedisProcess().start()
    results: dict[str, list[Figures]] = {}
    try:

        async def measure() -> None:
            results.update(await _measure_redis(redis_server, candidates, rounds, argument))

        run_async(measure)
    finally:
        redis_server.cleanup()
    for op, rows in results.items():
        print_table(
            f"Redis {op} (scripts given a {len(argument)}-byte argument; {rounds} rounds x "
            f"{REDIS_ITERATIONS[op]}; server: redis-server's CPU as it counts it)",
            rows,
        )


# -- Command line -----------------------------------------------------------------------------------------

BENCHMARKS: dict[str, Callable[[int], None]] = {
    "envelope": bench_envelopes,
    "websocket": bench_websocket,
    "redis": bench_redis,
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.libraries", description=DESCRIPTION)
    parser.add_argument("--only", choices=SECTIONS, help="run one measurement (default: all three)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of turns (default: %(default)s)")
    # The echo server of the WebSocket measurement, run in a process of its own.
    parser.add_argument("--serve", choices=sorted(SERVERS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        run_async(lambda: SERVERS[args.serve](args.port))
        return
    for section in [args.only] if args.only else SECTIONS:
        BENCHMARKS[section](args.rounds)


if __name__ == "__main__":
    main()
