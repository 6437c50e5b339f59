"""The chain backend, tested at the substrate-interface boundary.

The public chain cannot be reached from the test machines, so a stand-in for ``SubstrateInterface`` — an
object with the same ``query(module, storage_function, params)`` returning objects with ``.value``, and
``close()`` — is the only mock here. It holds ``TfgridModule`` storage as substrate-interface decodes it and
can drop its connection on demand. Everything around it (worker threads, locking, reconnection, timeouts,
decoding of every twin version) is the real code. Two tests use the real ``SubstrateInterface`` against
local sockets: one that refuses connections and one that never completes the websocket handshake.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from substrateinterface.exceptions import SubstrateRequestException
from websocket import WebSocketConnectionClosedException

from tests.support.servers import free_port
from twin_resolver import (
    AccountNotFound,
    ChainResolver,
    ResolverUnavailable,
    Twin,
    TwinNotFound,
    twin_from_chain,
)
from twin_resolver.accounts import ss58_encode

KEY_1 = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
KEY_2 = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
URL = "wss://tfchain.example"


@dataclass(frozen=True)
class Value:
    """What ``SubstrateInterface.query`` returns, reduced to the decoded ``value``."""

    value: Any


@dataclass
class Chain:
    """The chain's ``TfgridModule`` storage and a scripted list of failures; ``connect`` is the factory."""

    twins: dict[int, Any] = field(default_factory=dict)
    accounts: dict[str, Any] = field(default_factory=dict)  # "0x" + hex account -> twin id
    failures: list[Exception] = field(default_factory=list)  # raised by the next queries, in order
    refuse: list[Exception] = field(default_factory=list)  # raised by the next connects, in order
    connections: list[StandInSubstrate] = field(default_factory=list)
    gate: threading.Event | None = None  # when set, queries wait for it
    entered: threading.Event = field(default_factory=threading.Event)
    in_flight: int = 0
    most_in_flight: int = 0

    def connect(self) -> StandInSubstrate:
        if self.refuse:
            raise self.refuse.pop(0)
        self.connections.append(StandInSubstrate(self))
        return self.connections[-1]


class StandInSubstrate:
    """One connection to :class:`Chain` with ``SubstrateInterface``'s ``query`` and ``close``."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.queries: list[tuple[str, str, list[Any]]] = []
        self.closed = False

    def query(self, module: str, storage_function: str, params: list[Any]) -> Value:
        chain = self.chain
        if self.closed:
            raise WebSocketConnectionClosedException("socket is already closed.")
        self.queries.append((module, storage_function, params))
        chain.in_flight += 1
        chain.most_in_flight = max(chain.most_in_flight, chain.in_flight)
        try:
            chain.entered.set()
            if chain.gate is not None:
                chain.gate.wait(10)
            if chain.failures:
                raise chain.failures.pop(0)
            if module != "TfgridModule":
                raise SubstrateRequestException(f'Pallet "{module}" not found')
            if storage_function == "Twins":
                return Value(chain.twins.get(params[0]))
            if storage_function == "TwinIdByAccountID":
                return Value(chain.accounts.get(params[0]))
            raise SubstrateRequestException(f'Storage function "{module}.{storage_function}" not found')
        finally:
            chain.in_flight -= 1

    def close(self) -> None:
        self.closed = True


def _v1(twin_id: int, key: bytes, ip: str) -> dict[str, Any]:
    return {"version": 1, "id": twin_id, "account_id": ss58_encode(key), "ip": ip, "entities": []}


def _v2(twin_id: int, key: bytes, relay: str | None, pk: str | None = "0x" + "ab" * 32) -> dict[str, Any]:
    return {"id": twin_id, "account_id": ss58_encode(key), "relay": relay, "entities": [], "pk": pk}


@pytest.fixture
def chain() -> Chain:
    return Chain(twins={1: _v1(1, KEY_1, "300:1::2")}, accounts={"0x" + KEY_1.hex(): 1})


async def _unavailable(resolver: ChainResolver, twin_id: int = 1) -> str:
    with pytest.raises(ResolverUnavailable) as caught:
        await resolver.get_twin(twin_id)
    return str(caught.value)


# --- twins and accounts ----------------------------------------------------------------------------------


async def test_twins_and_accounts_from_the_chain(chain: Chain) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    assert await resolver.twin_id_by_public_key(KEY_1) == 1
    assert chain.connections[0].queries == [
        ("TfgridModule", "Twins", [1]),
        ("TfgridModule", "TwinIdByAccountID", ["0x" + KEY_1.hex()]),
    ]
    assert len(chain.connections) == 1  # one connection, kept
    await resolver.aclose()
    assert chain.connections[0].closed


async def test_an_absent_twin_is_not_found(chain: Chain) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    with pytest.raises(TwinNotFound, match="twin 2 not found"):
        await resolver.get_twin(2)
    await resolver.aclose()


@pytest.mark.parametrize("stored", [None, 0], ids=["none", "zero-default"])
async def test_an_account_without_a_twin_is_not_found(chain: Chain, stored: int | None) -> None:
    chain.accounts["0x" + KEY_2.hex()] = stored
    resolver = ChainResolver(URL, connect=chain.connect)
    with pytest.raises(AccountNotFound) as caught:
        await resolver.twin_id_by_public_key(KEY_2)
    assert caught.value.public_key == KEY_2
    await resolver.aclose()


async def test_a_bad_twin_id_for_an_account(chain: Chain) -> None:
    chain.accounts["0x" + KEY_2.hex()] = "seven"
    resolver = ChainResolver(URL, connect=chain.connect)
    with pytest.raises(
        ResolverUnavailable, match=f"the chain at {URL} sent a bad twin id 'seven' for an account"
    ):
        await resolver.twin_id_by_public_key(KEY_2)
    await resolver.aclose()


@pytest.mark.parametrize(
    ("stored", "address"),
    [
        (_v1(5, KEY_2, "300:1::5"), "300:1::5"),
        (_v1(5, KEY_2, "10.0.0.5:9000"), "10.0.0.5:9000"),
        ({**_v1(5, KEY_2, ""), "ip": "0x" + b"300:1::5".hex()}, "300:1::5"),
        ({**_v1(5, KEY_2, ""), "ip": list(b"300:1::5")}, "300:1::5"),
        (_v2(5, KEY_2, relay="300:1::7"), "300:1::7"),
        (_v2(5, KEY_2, relay="[300:1::7]:9000"), "[300:1::7]:9000"),
        (_v2(5, KEY_2, relay="10.1.2.3"), "10.1.2.3"),
        (_v2(5, KEY_2, relay="0x" + b"10.1.2.3".hex()), "10.1.2.3"),
        (_v2(5, KEY_2, relay="relay.grid.tf"), ""),
        (_v2(5, KEY_2, relay=None, pk=None), ""),
        ({**_v2(5, KEY_2, relay="10.1.2.3"), "ip": "300:1::5"}, "300:1::5"),
        ({**_v2(5, KEY_2, relay="10.1.2.3"), "ip": ""}, "10.1.2.3"),
    ],
    ids=[
        "v1",
        "v1-with-port",
        "v1-ip-as-hex",
        "v1-ip-as-bytes",
        "v2-relay-ipv6",
        "v2-relay-ipv6-port",
        "v2-relay-ipv4",
        "v2-relay-as-hex",
        "v2-relay-host-name",
        "v2-nothing",
        "ip-before-relay",
        "empty-ip-then-relay",
    ],
)
def test_every_twin_version_is_decoded(stored: dict[str, Any], address: str) -> None:
    twin = twin_from_chain(5, stored)
    assert (twin.id, twin.address, twin.public_key) == (5, address, KEY_2)


def test_a_relay_host_name_is_the_twins_relay_and_a_32_byte_pk_its_encryption_key() -> None:
    twin = twin_from_chain(5, _v2(5, KEY_2, relay="relay.grid.tf"))
    assert (twin.address, twin.relay, twin.encryption_key) == ("", "relay.grid.tf", b"\xab" * 32)
    # An rmb-rs twin's pk is a secp256k1 key (33 bytes): nothing to encrypt for with it.
    rmb_rs = twin_from_chain(5, _v2(5, KEY_2, relay="relay.grid.tf", pk="0x02" + "ab" * 32))
    assert rmb_rs.encryption_key is None
    # A relay that is an IP address is the twin's own address (older records).
    assert twin_from_chain(5, _v2(5, KEY_2, relay="10.1.2.3")).relay == ""


@pytest.mark.parametrize(
    "account", ["0x" + KEY_2.hex(), KEY_2.hex(), list(KEY_2), KEY_2], ids=["0x-hex", "hex", "list", "bytes"]
)
def test_accounts_in_any_encoding(account: Any) -> None:
    assert twin_from_chain(5, {**_v1(5, KEY_1, "1.2.3.4"), "account_id": account}).public_key == KEY_2


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ("0x1234", "expected a record, got str"),
        (_v1(6, KEY_2, ""), "it carries id 6"),
        ({"id": 5, "ip": "1.2.3.4"}, "it has no account_id"),
        ({**_v1(5, KEY_2, ""), "account_id": "nope"}, "'nope' is neither 64 hex digits nor an SS58"),
        ({**_v1(5, KEY_2, ""), "account_id": [1, 2]}, "its account_id is not 32 bytes"),
        ({**_v1(5, KEY_2, ""), "account_id": 7}, "its account_id is a int"),
    ],
)
async def test_an_unreadable_twin_is_unavailability(chain: Chain, stored: Any, reason: str) -> None:
    chain.twins[5] = stored
    resolver = ChainResolver(URL, connect=chain.connect)
    text = await _unavailable(resolver, 5)
    assert text.startswith(f"the chain at {URL} sent an unreadable twin 5: ")
    assert reason in text
    await resolver.aclose()


# --- connections -----------------------------------------------------------------------------------------


async def test_a_dropped_connection_is_replaced_and_the_call_retried(
    chain: Chain, caplog: pytest.LogCaptureFixture
) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    assert (await resolver.get_twin(1)).address == "300:1::2"
    chain.failures.append(WebSocketConnectionClosedException("Connection to remote host was lost."))
    with caplog.at_level(logging.INFO, logger="twin_resolver.chain"):
        assert await resolver.twin_id_by_public_key(KEY_1) == 1
    assert len(chain.connections) == 2
    first, fresh = chain.connections
    assert first.closed and not fresh.closed
    assert [q[1] for q in fresh.queries] == ["TwinIdByAccountID"]
    assert caplog.messages == [
        f"lost the connection to the chain at {URL} (WebSocketConnectionClosedException: "
        "Connection to remote host was lost.); reconnecting"
    ]
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    assert len(chain.connections) == 2
    await resolver.aclose()


async def test_a_reset_socket_counts_as_a_dropped_connection(chain: Chain) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    await resolver.get_twin(1)
    chain.failures.append(ConnectionResetError(104, "Connection reset by peer"))
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    assert len(chain.connections) == 2
    await resolver.aclose()


async def test_when_the_reconnection_fails_too_the_chain_is_unavailable(chain: Chain) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    await resolver.get_twin(1)
    chain.failures.append(WebSocketConnectionClosedException("Connection to remote host was lost."))
    chain.refuse.append(ConnectionRefusedError(111, "Connection refused"))
    assert await _unavailable(resolver) == (
        f"couldn't reach the chain at {URL}: ConnectionRefusedError: [Errno 111] Connection refused"
    )
    assert chain.connections[0].closed
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)  # the next look-up connects again
    await resolver.aclose()


async def test_a_first_connection_that_fails_is_not_retried_at_once(chain: Chain) -> None:
    chain.refuse.append(ConnectionRefusedError(111, "Connection refused"))
    chain.refuse.append(ConnectionRefusedError(111, "Connection refused"))
    resolver = ChainResolver(URL, connect=chain.connect)
    assert (await _unavailable(resolver)).startswith(
        f"couldn't reach the chain at {URL}: ConnectionRefusedError"
    )
    assert len(chain.refuse) == 1
    await resolver.aclose()


async def test_a_request_error_keeps_the_connection(chain: Chain) -> None:
    chain.failures.append(SubstrateRequestException({"code": -32000, "message": "Client error: busy"}))
    resolver = ChainResolver(URL, connect=chain.connect)
    assert await _unavailable(resolver) == (
        f"the chain at {URL} failed to answer: SubstrateRequestException: "
        "{'code': -32000, 'message': 'Client error: busy'}"
    )
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    assert len(chain.connections) == 1
    await resolver.aclose()


async def test_a_connection_that_cannot_start_its_session(chain: Chain) -> None:
    chain.refuse.append(SubstrateRequestException("Method not found"))
    resolver = ChainResolver(URL, connect=chain.connect)
    assert await _unavailable(resolver) == (
        f"the chain at {URL} failed to answer: SubstrateRequestException: Method not found"
    )
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    await resolver.aclose()


async def test_a_call_that_hangs_times_out(chain: Chain) -> None:
    chain.gate = threading.Event()
    resolver = ChainResolver(URL, timeout_s=0.2, connect=chain.connect)
    try:
        assert await _unavailable(resolver) == (
            f"couldn't reach the chain at {URL}: no answer for twin 1 within 0.2 s"
        )
    finally:
        chain.gate.set()
    assert await resolver.get_twin(1) == Twin(1, "300:1::2", KEY_1)
    await resolver.aclose()


async def test_calls_use_the_connection_one_at_a_time(chain: Chain) -> None:
    chain.gate = threading.Event()
    resolver = ChainResolver(URL, connect=chain.connect)
    lookups: list[asyncio.Task[Twin | int]] = [asyncio.create_task(resolver.get_twin(1)) for _ in range(3)]
    lookups.append(asyncio.create_task(resolver.twin_id_by_public_key(KEY_1)))
    await asyncio.to_thread(chain.entered.wait, 10)
    for _ in range(5):
        await asyncio.sleep(0)
    assert chain.in_flight == 1
    chain.gate.set()
    assert await asyncio.gather(*lookups) == [Twin(1, "300:1::2", KEY_1)] * 3 + [1]
    assert chain.most_in_flight == 1
    await resolver.aclose()


async def test_a_closed_resolver_answers_nothing(chain: Chain) -> None:
    resolver = ChainResolver(URL, connect=chain.connect)
    await resolver.aclose()
    assert await _unavailable(resolver) == f"the chain resolver for {URL} is closed"
    assert chain.connections == []


# --- the real SubstrateInterface against local sockets ---------------------------------------------------


async def test_the_real_client_reports_a_refused_connection() -> None:
    url = f"ws://127.0.0.1:{free_port()}"
    resolver = ChainResolver(url, timeout_s=5.0)
    text = await _unavailable(resolver)
    assert text.startswith(f"couldn't reach the chain at {url}: ConnectionRefusedError: ")
    await resolver.aclose()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(10)
        for conn in accepted:
            conn.close()
        listener.close()


async def test_the_real_client_times_out_on_a_silent_server(silent_port: int) -> None:
    url = f"ws://127.0.0.1:{silent_port}"
    resolver = ChainResolver(url, timeout_s=0.3)
    text = await _unavailable(resolver)
    assert text.startswith(f"couldn't reach the chain at {url}: ")
    assert "timed out" in text or "within 0.3 s" in text
    await resolver.aclose()
