"""The HTTP twin source against a real HTTP server on a free port, and the factory that picks a source."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import free_port
from twin_resolver import (
    CachedResolver,
    ChainResolver,
    HttpResolver,
    Resolver,
    ResolverUnavailable,
    StaticResolver,
    Twin,
    TwinFileError,
    TwinNotFound,
    build_resolver,
    write_twin_file,
)
from twin_resolver.accounts import ss58_encode

KEY_1 = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
KEY_2 = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
SLOW = "slow"  # a route that never answers in time
Opener = Callable[..., HttpResolver]


@dataclass
class TwinSource:
    """A real HTTP server answering ``GET /twin/{id}`` from ``routes`` (path -> status and body)."""

    url: str
    routes: dict[str, tuple[int, bytes] | str] = field(default_factory=dict)
    clients: list[tuple[str, int]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def twin(self, twin_id: int, doc: object, status: int = 200) -> None:
        self.routes[f"/twin/{twin_id}"] = (status, json.dumps(doc).encode())


def _handler(source: TwinSource) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the explorer's server does

        def do_GET(self) -> None:
            source.clients.append(self.client_address[:2])
            route = source.routes.get(self.path, (404, b'{"error": "not found"}'))
            if route == SLOW:
                source.release.wait(30)
                self.close_connection = True
                return
            assert not isinstance(route, str)
            status, body = route
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def source() -> Iterator[TwinSource]:
    twin_source = TwinSource("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(twin_source))
    twin_source.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield twin_source
    finally:
        twin_source.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def _v1(twin_id: int, account: str, ip: str = "300:1::2") -> dict[str, object]:
    return {"version": 1, "id": twin_id, "account": account, "ip": ip}


@pytest.fixture
async def opened() -> AsyncIterator[Opener]:
    """Makes HTTP resolvers and closes them after the test, whatever its outcome."""
    resolvers: list[HttpResolver] = []

    def open_resolver(url: str, **options: Any) -> HttpResolver:
        resolvers.append(HttpResolver(url, **options))
        return resolvers[-1]

    yield open_resolver
    for resolver in resolvers:
        await resolver.aclose()


async def _unavailable(resolver: Resolver, twin_id: int) -> str:
    with pytest.raises(ResolverUnavailable) as caught:
        await resolver.get_twin(twin_id)
    return str(caught.value)


# --- the HTTP source -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "account",
    [ss58_encode(KEY_1), "0x" + KEY_1.hex(), KEY_1.hex(), "0x" + KEY_1.hex().upper()],
    ids=["ss58", "0x-hex", "bare-hex", "upper-hex"],
)
async def test_a_twin_with_either_account_format(opened: Opener, source: TwinSource, account: str) -> None:
    source.twin(7, _v1(7, account))
    resolver = opened(source.url)
    assert await resolver.get_twin(7) == Twin(7, "300:1::2", KEY_1)


async def test_a_trailing_slash_and_a_missing_ip(opened: Opener, source: TwinSource) -> None:
    source.twin(8, {"version": 1, "id": 8, "account": KEY_2.hex()})
    resolver = opened(source.url + "/")
    assert await resolver.get_twin(8) == Twin(8, "", KEY_2)


async def test_a_twin_reached_through_a_relay(opened: Opener, source: TwinSource) -> None:
    source.twin(
        8, {"id": 8, "account": KEY_2.hex(), "ip": "", "relay": "relay.example:8051", "pk": "ab" * 32}
    )
    resolver = opened(source.url)
    twin = await resolver.get_twin(8)
    assert (twin.address, twin.relay, twin.encryption_key) == ("", "relay.example:8051", b"\xab" * 32)


async def test_404_is_twin_not_found(opened: Opener, source: TwinSource) -> None:
    resolver = opened(source.url)
    with pytest.raises(TwinNotFound, match="twin 9 not found"):
        await resolver.get_twin(9)


async def test_a_server_error_is_unavailability(opened: Opener, source: TwinSource) -> None:
    source.routes["/twin/7"] = (500, b"internal error")
    resolver = opened(source.url)
    assert await _unavailable(resolver, 7) == f"the twin source at {source.url} answered HTTP 500 for twin 7"


async def test_a_slow_server_times_out(opened: Opener, source: TwinSource) -> None:
    source.routes["/twin/7"] = SLOW
    resolver = opened(source.url, timeout_s=0.2)
    assert (
        await _unavailable(resolver, 7)
        == f"the twin source at {source.url} did not answer for twin 7 in 0.2 s"
    )


async def test_an_unreachable_server(
    opened: Opener,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    resolver = opened(url)
    assert (await _unavailable(resolver, 7)).startswith(f"couldn't reach the twin source at {url}: ")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"version": 1, "id": 7, "acc', "Unterminated string"),
        (b"\x80abc", "can't decode byte 0x80"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (json.dumps(_v1(6, KEY_1.hex())).encode(), "it is twin 6"),
        (json.dumps({"id": 7, "ip": "1.2.3.4"}).encode(), "account must be a string, got None"),
        (json.dumps(_v1(7, "nope")).encode(), "'nope' is neither 64 hex digits nor an SS58"),
        (json.dumps({**_v1(7, KEY_1.hex()), "ip": 5}).encode(), "ip must be a string, got 5"),
        (json.dumps({**_v1(7, KEY_1.hex()), "pk": "xyz"}).encode(), "pk must be 64 hex digits"),
    ],
    ids=["truncated", "not-utf8", "list", "other-id", "no-account", "bad-account", "ip-not-text", "bad-pk"],
)
async def test_a_bad_answer_is_unavailability(
    opened: Opener, source: TwinSource, body: bytes, reason: str
) -> None:
    source.routes["/twin/7"] = (200, body)
    resolver = opened(source.url)
    text = await _unavailable(resolver, 7)
    assert text.startswith(f"the twin source at {source.url} sent an unreadable answer for twin 7: ")
    assert reason in text


async def test_one_connection_is_kept_alive(opened: Opener, source: TwinSource) -> None:
    source.twin(1, _v1(1, KEY_1.hex()))
    source.twin(2, _v1(2, KEY_2.hex()))
    resolver = opened(source.url)
    await resolver.get_twin(1)
    await resolver.get_twin(2)
    await resolver.get_twin(1)
    assert len(source.clients) == 3 and len(set(source.clients)) == 1


async def test_proxy_variables_are_ignored(
    opened: Opener, source: TwinSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{free_port()}")
    source.twin(1, _v1(1, KEY_1.hex()))
    resolver = opened(source.url)
    assert (await resolver.get_twin(1)).public_key == KEY_1


async def test_accounts_cannot_be_looked_up(
    opened: Opener,
) -> None:
    resolver = opened("http://127.0.0.1:1")
    with pytest.raises(ResolverUnavailable) as caught:
        await resolver.twin_id_by_public_key(KEY_1)
    assert str(caught.value) == "the HTTP twin source cannot look up an account; pass --twin N"


async def test_a_given_client_is_left_open(source: TwinSource) -> None:
    source.twin(1, _v1(1, KEY_1.hex()))
    async with httpx.AsyncClient(trust_env=False) as client:
        resolver = HttpResolver(source.url, client=client)
        await resolver.get_twin(1)
        await resolver.aclose()
        assert not client.is_closed


# --- the factory -----------------------------------------------------------------------------------------


async def test_the_factory_caches_an_http_source_and_serves_stale(source: TwinSource) -> None:
    source.twin(1, _v1(1, KEY_1.hex()))
    resolver = build_resolver(
        source.url, None, ttl_s=0.0, negative_ttl_s=0.0, stale_for_s=3600.0, timeout_s=5.0
    )
    assert isinstance(resolver, CachedResolver) and isinstance(resolver.inner, HttpResolver)
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    source.routes["/twin/1"] = (503, b"")
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    assert resolver.stats.stale_served == 1 and resolver.stats.failures == 1
    await resolver.aclose()


async def test_the_factory_prefers_the_twin_file(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [Twin(1, "1.2.3.4", KEY_1)])
    resolver = build_resolver("wss://tfchain.grid.tf", path)
    assert isinstance(resolver, StaticResolver)
    assert await resolver.twin_id_by_public_key(KEY_1) == 1
    with pytest.raises(TwinFileError, match="twin file not found"):
        build_resolver(None, tmp_path / "missing.json")


@pytest.mark.parametrize("url", ["ws://127.0.0.1:9944", "WSS://tfchain.grid.tf"])
async def test_the_factory_puts_the_chain_behind_the_cache(url: str) -> None:
    resolver = build_resolver(url, None, timeout_s=3.0)
    assert isinstance(resolver, CachedResolver) and isinstance(resolver.inner, ChainResolver)
    assert resolver.inner.url == url
    await resolver.aclose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.org", "unsupported twin source URL 'ftp://example.org': use ws:// or wss://"),
        ("tfchain.grid.tf", "unsupported twin source URL 'tfchain.grid.tf'"),
        (None, "no twin source: give a twin file (--twins FILE) or a chain URL (--substrate URL)"),
        ("", "no twin source"),
    ],
)
def test_the_factory_rejects_what_it_cannot_use(url: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_resolver(url, None)
