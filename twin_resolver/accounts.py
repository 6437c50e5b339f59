"""Account ids as text: SS58 addresses (what tfchain shows) and 64 hex digits, without the signing stack."""

from __future__ import annotations

import re
from typing import cast

_HEX_ACCOUNT = re.compile(r"(0x)?[0-9a-fA-F]{64}")


def ss58_encode(public_key: bytes, ss58_format: int = 42) -> str:
    """The SS58 address of a 32-byte account id (format 42: generic substrate, as tfchain uses)."""
    from scalecodec.utils.ss58 import ss58_encode as encode

    return cast(str, encode(public_key, ss58_format))


def account_from_text(text: str) -> bytes:
    """A 32-byte account id from 64 hex digits (``0x`` optional) or an SS58 address, else ``ValueError``."""
    text = text.strip()
    if _HEX_ACCOUNT.fullmatch(text):
        return bytes.fromhex(text.removeprefix("0x"))
    from scalecodec.utils.ss58 import ss58_decode

    try:
        decoded = bytes.fromhex(ss58_decode(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"{text!r} is neither 64 hex digits nor an SS58 address ({exc})") from None
    if len(decoded) != 32:
        raise ValueError(f"{text!r} is an SS58 address of {len(decoded)} bytes, not a 32-byte account id")
    return decoded


def encryption_key_from_text(text: str) -> bytes:
    """A 32-byte X25519 public key (a twin's ``pk``) from 64 hex digits, ``0x`` optional; else
    ``ValueError``."""
    text = text.strip()
    if not _HEX_ACCOUNT.fullmatch(text):
        raise ValueError(f"pk must be 64 hex digits (an X25519 public key), got {text!r}")
    return bytes.fromhex(text.removeprefix("0x"))


def relay_fields(entry: dict[str, object]) -> tuple[str, bytes | None]:
    """A twin entry's ``relay`` (``host:port``, empty when none) and ``pk`` (None when none); ``ValueError``
    says what is wrong with them."""
    relay = entry.get("relay") or ""
    if not isinstance(relay, str):
        raise ValueError(f"relay must be a string, got {relay!r}")
    pk = entry.get("pk")
    if pk is None or pk == "":
        return relay.strip(), None
    if not isinstance(pk, str):
        raise ValueError(f"pk must be a string, got {pk!r}")
    return relay.strip(), encryption_key_from_text(pk)
