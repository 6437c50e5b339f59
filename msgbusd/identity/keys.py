"""The daemon's own key, from the ``--mnemonics`` secret (account ids as text: :mod:`twin_resolver.accounts`).

A secret is a BIP39 phrase (the substrate mini-secret, as ``Keypair.create_from_mnemonic`` makes it) or a
``0x`` + 64 hex seed, optionally followed by a derivation path (``<phrase>//alice``), as substrate's SURIs.
No error message ever contains the secret or its path.
"""

from __future__ import annotations

import hashlib
import re
from typing import cast

import bip39
import sr25519

from msgbusd.identity.signing import KeyType, Signer

KEY_TYPES: tuple[KeyType, ...] = ("sr25519", "ed25519")

_HEX_SEED = re.compile(r"0x[0-9a-fA-F]{64}")


class IdentityError(ValueError):
    """The secret or key type given to the daemon cannot make a key (the message never holds the secret)."""


def load_signer(secret: str, key_type: str) -> Signer:
    """Make the signer for ``secret``: a BIP39 phrase or ``0x`` seed, optionally followed by ``//hard``
    junctions (and, for sr25519 only, ``/soft`` ones), as substrate reads a SURI."""
    kind = _key_type(key_type)
    base, slash, rest = secret.strip().partition("/")
    path = slash + rest
    seed = _seed(base)
    if not path:
        return Signer(seed, kind)
    if "///" in path:
        raise IdentityError("--mnemonics: passwords (///) in a derivation path are not supported")
    junctions = _junctions(path)
    if kind == "ed25519":
        return Signer(_ed25519_derive(seed, junctions), kind)
    return Signer.from_sr25519_secret(_sr25519_derive(seed, junctions))


def new_mnemonic() -> str:
    """A fresh random 12-word BIP39 phrase."""
    return cast(str, bip39.bip39_generate(12))


def _key_type(key_type: str) -> KeyType:
    kind = key_type.strip().lower()
    for known in KEY_TYPES:
        if kind == known:
            return known
    raise IdentityError(f"unknown key type {key_type!r}: use sr25519 or ed25519")


def _seed(base: str) -> bytes:
    if not base:
        raise IdentityError("--mnemonics: empty secret, give a BIP39 phrase or a 0x hex seed")
    if base.startswith("0x"):
        if not _HEX_SEED.fullmatch(base):
            raise IdentityError("--mnemonics: a hex seed is 0x followed by exactly 64 hex digits")
        return bytes.fromhex(base[2:])
    phrase = " ".join(base.split())
    if not bip39.bip39_validate(phrase):
        raise IdentityError("--mnemonics: not a valid BIP39 phrase (checksum or word list)")
    return bytes(bip39.bip39_to_mini_secret(phrase, ""))


def _junctions(path: str) -> list[tuple[bytes, bool]]:
    """(chain code, is hard) per junction of a path such as ``//alice/0``."""
    from substrateinterface.key import extract_derive_path

    try:
        return [(bytes(j.chain_code), bool(j.is_hard)) for j in extract_derive_path(path)]
    except ValueError:
        raise IdentityError("--mnemonics: malformed derivation path (expected /soft or //hard)") from None


def _ed25519_derive(seed: bytes, junctions: list[tuple[bytes, bool]]) -> bytes:
    # Substrate's ed25519 hard junction: blake2b-256 of SCALE(("Ed25519HDKD", seed, chain code)).
    for chain_code, is_hard in junctions:
        if not is_hard:
            raise IdentityError("--mnemonics: ed25519 keys support only hard (//) derivation")
        data = bytes([len(b"Ed25519HDKD") << 2]) + b"Ed25519HDKD" + seed + chain_code
        seed = hashlib.blake2b(data, digest_size=32).digest()
    return seed


def _sr25519_derive(seed: bytes, junctions: list[tuple[bytes, bool]]) -> bytes:
    public, secret = sr25519.pair_from_seed(seed)
    for chain_code, is_hard in junctions:
        derive = sr25519.hard_derive_keypair if is_hard else sr25519.derive_keypair
        _, public, secret = derive((chain_code, public, secret), b"")
    return bytes(secret)
