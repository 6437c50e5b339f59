"""What msgbusd needs to know about twins, and the interface every twin source implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Twin:
    """A twin: its id, the address its daemon listens on, and its 32-byte account id (public key).

    ``relay`` (``host:port``) names the relay the twin's site keeps a link to: msgbus sites send to it there,
    and encrypt the payload for the twin. ``encryption_key`` is the twin's own X25519 key for that (``pk``;
    without it, an ed25519 account's key converted).
    """

    id: int
    address: str
    public_key: bytes
    name: str | None = None
    relay: str = ""
    encryption_key: bytes | None = None


class ResolverError(Exception):
    """A twin look-up that did not give an answer."""


class TwinNotFound(ResolverError):
    """No twin has this id."""

    def __init__(self, twin_id: int) -> None:
        super().__init__(f"twin {twin_id} not found")
        self.twin_id = twin_id


class AccountNotFound(ResolverError):
    """No twin is registered for this account (public key)."""

    def __init__(self, public_key: bytes) -> None:
        from twin_resolver.accounts import ss58_encode

        account = ss58_encode(public_key) if len(public_key) == 32 else "0x" + public_key.hex()
        super().__init__(f"no twin found for account {account}")
        self.public_key = public_key


class ResolverUnavailable(ResolverError):
    """The twin source could not answer (unreachable, timed out, bad data); the message says why."""


class Resolver(Protocol):
    """A source of twins (a chain, a file, a cache in front of another resolver)."""

    async def get_twin(self, twin_id: int) -> Twin:
        """The twin with this id; raises :class:`TwinNotFound` or :class:`ResolverUnavailable`."""
        ...

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        """The id of the twin whose account is ``public_key``; raises :class:`AccountNotFound` or
        :class:`ResolverUnavailable`."""
        ...

    async def aclose(self) -> None:
        """Release connections; the resolver is not used afterwards."""
        ...
