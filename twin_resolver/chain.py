"""Twins from TFChain (``TfgridModule``) over substrate-interface's websocket.

substrate-interface is synchronous and one connection must not serve two calls at once, so every call runs
in a worker thread, one at a time. A dropped connection is replaced and the call retried once; anything else
that keeps the chain from answering becomes :class:`ResolverUnavailable` naming the URL and the cause.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from websocket import WebSocketException

from twin_resolver.accounts import account_from_text
from twin_resolver.base import AccountNotFound, ResolverUnavailable, Twin, TwinNotFound

log = logging.getLogger(__name__)

MODULE = "TfgridModule"
TWINS = "Twins"
TWIN_ID_BY_ACCOUNT = "TwinIdByAccountID"
SS58_FORMAT = 42  # tfchain's accounts are generic substrate addresses

# What a broken connection looks like: socket errors (refused, reset, timed out) and websocket-client's own.
CONNECTION_ERRORS: tuple[type[Exception], ...] = (OSError, WebSocketException)

T = TypeVar("T")


class StorageValue(Protocol):
    """What ``SubstrateInterface.query`` returns: a decoded SCALE value."""

    @property
    def value(self) -> Any: ...


class Substrate(Protocol):
    """The part of ``substrateinterface.SubstrateInterface`` this module uses."""

    def query(self, module: str, storage_function: str, params: list[Any]) -> StorageValue: ...

    def close(self) -> None: ...


def substrate_connector(url: str, timeout_s: float) -> Callable[[], Substrate]:
    """A factory of connected ``SubstrateInterface`` objects for ``url``, each socket read bounded by
    ``timeout_s``."""

    def connect() -> Substrate:
        from substrateinterface import SubstrateInterface

        # auto_reconnect off: its reconnect only covers a failed send and retries without bound;
        # ChainResolver replaces the connection itself and retries once.
        substrate: Substrate = SubstrateInterface(
            url=url, ss58_format=SS58_FORMAT, ws_options={"timeout": timeout_s}, auto_reconnect=False
        )
        return substrate

    return connect


class ChainResolver:
    """A :class:`~twin_resolver.base.Resolver` reading ``TfgridModule.Twins`` and ``TwinIdByAccountID``."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        connect: Callable[[], Substrate] | None = None,
    ) -> None:
        """Resolve from the chain at ``url`` (``ws://`` or ``wss://``); connects on the first look-up.

        ``timeout_s`` bounds a whole look-up, reconnection included. ``connect`` makes a new connection
        (default: :func:`substrate_connector`).
        """
        self.url = url
        self._timeout_s = timeout_s
        self._connect = connect or substrate_connector(url, timeout_s)
        self._substrate: Substrate | None = None
        self._closed = False
        # The asyncio lock keeps waiting callers out of the thread pool; the thread lock protects the
        # connection from a thread whose caller timed out and is still using it.
        self._queue = asyncio.Lock()
        self._connection_lock = threading.Lock()

    async def get_twin(self, twin_id: int) -> Twin:
        """The twin with this id, or :class:`TwinNotFound`."""
        what = f"twin {twin_id}"
        value = await self._query(TWINS, [twin_id], what)
        if value is None:
            raise TwinNotFound(twin_id)
        try:
            return twin_from_chain(twin_id, value)
        except ValueError as exc:
            raise ResolverUnavailable(f"the chain at {self.url} sent an unreadable {what}: {exc}") from exc

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        """The id of the twin whose account is ``public_key``, or :class:`AccountNotFound`."""
        value = await self._query(TWIN_ID_BY_ACCOUNT, ["0x" + public_key.hex()], "the twin of an account")
        # The storage map's default (no twin) reads as 0 on older runtimes and None on newer ones.
        if value is None or value == 0:
            raise AccountNotFound(public_key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ResolverUnavailable(f"the chain at {self.url} sent a bad twin id {value!r} for an account")
        return value

    async def aclose(self) -> None:
        """Close the connection (waiting for a call still running in its thread)."""
        self._closed = True
        await asyncio.to_thread(self._close_connection)

    async def _query(self, storage_function: str, params: list[Any], what: str) -> Any:
        if self._closed:
            raise ResolverUnavailable(f"the chain resolver for {self.url} is closed")

        def read(substrate: Substrate) -> Any:
            return substrate.query(MODULE, storage_function, params).value

        try:
            async with asyncio.timeout(self._timeout_s), self._queue:
                return await asyncio.to_thread(self._call, read)
        except TimeoutError:
            raise ResolverUnavailable(
                f"couldn't reach the chain at {self.url}: no answer for {what} within {self._timeout_s:g} s"
            ) from None

    def _call(self, read: Callable[[Substrate], T]) -> T:
        """In a worker thread: ``read`` on the connection, on a fresh one if the current one dropped."""
        with self._connection_lock:
            reused = self._substrate is not None
            try:
                return self._attempt(read)
            except CONNECTION_ERRORS as exc:
                self._drop_connection()
                if not reused:
                    raise self._unreachable(exc) from exc
                log.info("lost the connection to the chain at %s (%s); reconnecting", self.url, _cause(exc))
            try:
                return self._attempt(read)
            except CONNECTION_ERRORS as exc:
                self._drop_connection()
                raise self._unreachable(exc) from exc

    def _attempt(self, read: Callable[[Substrate], T]) -> T:
        try:
            if self._substrate is None:
                self._substrate = self._connect()
            return read(self._substrate)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:
            # RPC errors, missing storage functions, undecodable data: the connection is fine, the answer not.
            raise ResolverUnavailable(f"the chain at {self.url} failed to answer: {_cause(exc)}") from exc

    def _unreachable(self, exc: Exception) -> ResolverUnavailable:
        return ResolverUnavailable(f"couldn't reach the chain at {self.url}: {_cause(exc)}")

    def _drop_connection(self) -> None:
        substrate, self._substrate = self._substrate, None
        if substrate is not None:
            try:
                substrate.close()
            except Exception as exc:  # closing a broken socket may fail too; it is being discarded anyway
                log.debug("closing the chain connection to %s: %s", self.url, exc)

    def _close_connection(self) -> None:
        with self._connection_lock:
            self._drop_connection()


def twin_from_chain(twin_id: int, value: Any) -> Twin:
    """A :class:`Twin` from a decoded ``Twins`` entry of any version; ``ValueError`` if it is unusable.

    Older twins are ``{version, id, account_id, ip, entities}``; newer ones have ``relay`` and ``pk`` instead
    of (or besides) ``ip``. The address is ``ip`` when set, else ``relay`` when that is an IP address (older
    records put the twin's own address there, and such a ``relay`` is no relay), else empty; a ``relay`` host
    name is the twin's relay. ``pk`` is the twin's encryption key when it is one (32 bytes).
    """
    if not isinstance(value, dict):
        raise ValueError(f"expected a record, got {type(value).__name__}")
    stored_id = value.get("id", twin_id)
    if stored_id != twin_id:
        raise ValueError(f"it carries id {stored_id!r}")
    account = value.get("account_id", value.get("account"))
    if account is None:
        raise ValueError("it has no account_id")
    public_key = _account(account)
    ip = _text(value.get("ip"))
    relay = _text(value.get("relay"))
    if relay and _is_ip_address(relay):
        # Older records put the twin's own address there: it is no relay.
        address, relay = ip or relay, ""
    else:
        address = ip
    pk = _bytes(value.get("pk")) if not isinstance(value.get("pk"), str) else _hex_bytes(value["pk"])
    # Only an X25519 key (32 bytes) encrypts for the twin; rmb-rs twins publish a secp256k1 one (33 bytes).
    encryption_key = pk if pk is not None and len(pk) == 32 else None
    return Twin(
        id=twin_id, address=address, public_key=public_key, relay=relay, encryption_key=encryption_key
    )


def _account(value: Any) -> bytes:
    if isinstance(value, bytes | list):
        raw = _bytes(value)
        if raw is not None and len(raw) == 32:
            return raw
        raise ValueError("its account_id is not 32 bytes")
    if isinstance(value, str):
        return account_from_text(value)
    raise ValueError(f"its account_id is a {type(value).__name__}")


def _text(value: Any) -> str:
    """A byte-string field as text: substrate-interface gives UTF-8 bytes as a string, others as 0x hex."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("0x"):
            try:
                return bytes.fromhex(text[2:]).decode("utf-8").strip()
            except ValueError:
                return text
        return text
    raw = _bytes(value)
    if raw is None:
        return ""
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return ""


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)
    return None


def _hex_bytes(text: str) -> bytes | None:
    try:
        return bytes.fromhex(text.strip().removeprefix("0x"))
    except ValueError:
        return None


def _is_ip_address(text: str) -> bool:
    host = text
    if text.startswith("["):
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        host = text.partition(":")[0]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
