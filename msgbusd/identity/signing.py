"""RMB envelope signatures: the challenge digest, signing with our key and verifying a peer's.

A signature on the wire is ``hex(type byte + 64-byte signature)``; the type byte is ``e`` (ed25519, RFC 8032)
or ``s`` (sr25519, schnorrkel with signing context ``substrate``). Both sign the raw 16-byte MD5 challenge.
:class:`SignatureError` messages are go-rmb's texts, which peers and clients see verbatim.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
from typing import Literal

import nacl.exceptions
import nacl.public
import nacl.signing
import sr25519

from wire.envelope import Envelope

KeyType = Literal["ed25519", "sr25519"]

TYPE_ED25519 = b"e"
TYPE_SR25519 = b"s"
_TYPE_BYTES: dict[str, bytes] = {"ed25519": TYPE_ED25519, "sr25519": TYPE_SR25519}

SIGNATURE_LENGTH = 65  # type byte + 64-byte signature

EMPTY_SIGNATURE = "signature field is empty, visit the project github repo for instructions to update"
BAD_SIGNATURE = "couldn't verify signature"


class SignatureError(Exception):
    """A signature that does not verify; ``message`` is the exact text to answer the sender with."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def challenge(env: Envelope, dat: str | None = None) -> bytes:
    """The 16-byte MD5 digest an envelope's signature covers. ``dat`` replaces ``env.dat`` when given."""
    digest = hashlib.md5()
    # Field by field: a large payload is hashed where it is, not copied into one text first.
    for field in (
        str(env.ver),
        env.uid,
        env.cmd,
        env.dat if dat is None else dat,
        str(env.src),
        "".join(str(d) for d in env.dst),
        env.ret,
        str(env.now),
        "true" if env.pxy else "false",
    ):
        digest.update(_utf8(field))
    return digest.digest()


class Signer:
    """Signs with one key. Keys are derived once, here, so that signing is one primitive call."""

    key_type: KeyType
    public_key: bytes

    def __init__(self, seed: bytes, key_type: KeyType) -> None:
        """Build from a 32-byte seed (the substrate mini-secret) and a key type."""
        if len(seed) != 32:
            raise ValueError(f"a seed is 32 bytes, got {len(seed)}")
        if key_type == "ed25519":
            self._ed25519: nacl.signing.SigningKey | None = nacl.signing.SigningKey(seed)
            self._sr25519: tuple[bytes, bytes] | None = None
            public_key = self._ed25519.verify_key.encode()
        elif key_type == "sr25519":
            public, secret = sr25519.pair_from_seed(seed)
            self._ed25519 = None
            self._sr25519 = (bytes(public), bytes(secret))
            public_key = self._sr25519[0]
        else:
            raise ValueError(f"unknown key type {key_type!r}: use sr25519 or ed25519")
        self.key_type = key_type
        self.public_key = public_key
        self._type_byte = _TYPE_BYTES[key_type]

    @classmethod
    def from_sr25519_secret(cls, secret: bytes) -> Signer:
        """Build from an expanded 64-byte sr25519 secret (key + nonce), e.g. one derived along a SURI path."""
        if len(secret) != 64:
            raise ValueError(f"an sr25519 secret key is 64 bytes, got {len(secret)}")
        signer = cls.__new__(cls)
        public = bytes(sr25519.public_from_secret_key(secret))
        signer._ed25519 = None
        signer._sr25519 = (public, bytes(secret))
        signer.key_type = "sr25519"
        signer.public_key = public
        signer._type_byte = TYPE_SR25519
        return signer

    def sign_digest(self, digest: bytes) -> bytes:
        """The 65-byte wire signature (type byte + signature) of ``digest``."""
        if self._ed25519 is not None:
            return self._type_byte + self._ed25519.sign(digest).signature
        assert self._sr25519 is not None
        return self._type_byte + bytes(sr25519.sign(self._sr25519, digest))

    def encryption_key(self) -> nacl.public.PrivateKey:
        """The X25519 key payloads through a relay are encrypted with (:mod:`msgbusd.identity.sealing`): the
        ed25519 key converted, or one hashed from the sr25519 secret."""
        if self._ed25519 is not None:
            return self._ed25519.to_curve25519_private_key()
        assert self._sr25519 is not None
        return nacl.public.PrivateKey(
            hashlib.blake2b(b"msgbus-box\n" + self._sr25519[1], digest_size=32).digest()
        )

    def sign(self, env: Envelope, dat: str | None = None) -> Envelope:
        """A copy of ``env`` with ``sig`` set; ``dat`` overrides the signed payload (see ``challenge``)."""
        return env.replace(sig=self.sign_digest(challenge(env, dat)).hex())

    def __repr__(self) -> str:
        return f"Signer({self.key_type}, public_key={self.public_key.hex()})"


def verify(env: Envelope, public_key: bytes, dat: str | None = None) -> None:
    """Check ``env.sig`` against the sender's 32-byte ``public_key``; raise :class:`SignatureError` if bad.

    Checks run in go-rmb's order: empty, hex, type byte, length, signature.
    """
    verify_digest(env.sig, challenge(env, dat), public_key)


def verify_digest(sig: str, digest: bytes, public_key: bytes) -> None:
    """Check a wire signature ``sig`` (hex of type byte + signature) of ``digest``; raise
    :class:`SignatureError` if bad."""
    if not sig:
        raise SignatureError(EMPTY_SIGNATURE)
    try:
        raw = binascii.unhexlify(sig)
    except ValueError:
        raise SignatureError(f"couldn't decode signature: {_go_hex_error(sig)}") from None
    type_byte = raw[:1]
    if type_byte not in (TYPE_ED25519, TYPE_SR25519):
        raise SignatureError(f"unrecognized signature prefix {type_byte.hex()}")
    if len(raw) != SIGNATURE_LENGTH:
        raise SignatureError(BAD_SIGNATURE)
    signature = raw[1:]
    if type_byte == TYPE_ED25519:
        ok = _verify_ed25519(public_key, digest, signature)
    else:
        ok = _verify_sr25519(public_key, digest, signature)
    if not ok:
        raise SignatureError(BAD_SIGNATURE)


def _verify_ed25519(public_key: bytes, digest: bytes, signature: bytes) -> bool:
    try:
        _ed25519_verify_key(public_key).verify(digest, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True


def _verify_sr25519(public_key: bytes, digest: bytes, signature: bytes) -> bool:
    if len(public_key) != 32:
        return False
    try:
        return bool(sr25519.verify(signature, digest, public_key))
    except (ValueError, TypeError):
        return False


@functools.lru_cache(maxsize=4096)
def _ed25519_verify_key(public_key: bytes) -> nacl.signing.VerifyKey:
    # Building a VerifyKey decompresses the curve point; peers are few, so keep them.
    return nacl.signing.VerifyKey(public_key)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (JSON "\ud800"): Go's decoder turns it into U+FFFD, so sign what a Go peer signs.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _go_hex_error(text: str) -> str:
    """The error Go's ``hex.DecodeString`` gives for ``text`` (called only when decoding failed)."""
    for byte in _utf8(text):
        if chr(byte) not in "0123456789abcdefABCDEF":
            return f"encoding/hex: invalid byte: {_go_rune(byte)}"
    return "encoding/hex: odd length hex string"


def _go_rune(byte: int) -> str:
    """Go's ``%#U`` of one byte: ``U+0067 'g'``, without the quoted character when it is not printable."""
    char = chr(byte)
    return f"U+{byte:04X} '{char}'" if char.isprintable() else f"U+{byte:04X}"
