"""Payloads only the two ends can read: what goes through a relay has its ``dat`` encrypted for the other end.

X25519 key agreement and XSalsa20-Poly1305 (PyNaCl's :class:`~nacl.public.Box`). A site's encryption key
follows from its signing key: an ed25519 key converted to X25519 (the standard conversion), an sr25519 key
hashed into one (such a twin publishes the public half as ``pk``: ``msgbus identity`` prints it). The other
end's key is its twin's ``pk`` when it has one, else its ed25519 account converted.

The nonce is a digest of what the message is (ends, uid, command, payload): a message sent again is the same
bytes, so the receiver's de-duplication still knows it, and two different messages never share a nonce. The
signature covers the encrypted ``dat``, so a relay can neither read nor change it unnoticed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict

import nacl.bindings
import nacl.exceptions
import nacl.public

from twin_resolver.base import Twin
from wire.envelope import Envelope

# Boxes kept (one per peer key: the key agreement is done once per peer).
KEPT_BOXES = 4096


class SealError(Exception):
    """A payload that cannot be encrypted or decrypted; the message says why."""


def public_key_of(twin: Twin) -> bytes:
    """The key to encrypt for ``twin``: its ``pk``, else its account as an ed25519 key converted."""
    if twin.encryption_key is not None:
        return twin.encryption_key
    try:
        return bytes(nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(twin.public_key))
    except (nacl.exceptions.RuntimeError, nacl.exceptions.ValueError, nacl.exceptions.TypeError) as exc:
        raise SealError(f"twin {twin.id} has no encryption key: its twin entry needs a pk") from exc


class Sealer:
    """Encrypts payloads for other twins and decrypts theirs, with this site's key."""

    def __init__(self, private_key: nacl.public.PrivateKey) -> None:
        self._private_key = private_key
        self.public_key = bytes(private_key.public_key)
        self._boxes: OrderedDict[bytes, nacl.public.Box] = OrderedDict()

    def seal(self, env: Envelope, recipient: Twin) -> Envelope:
        """``env`` with its ``dat`` encrypted for ``recipient`` (``env.dst``)."""
        box = self._box(public_key_of(recipient))
        plain = env.dat.encode()
        nonce = hashlib.blake2b(_context(env) + plain, digest_size=nacl.public.Box.NONCE_SIZE).digest()
        sealed = box.encrypt(plain, nonce)
        return env.replace(dat=base64.b64encode(bytes(sealed)).decode())

    def open(self, env: Envelope, sender: Twin) -> Envelope:
        """``env`` with its ``dat`` decrypted, sent by ``sender`` (``env.src``); :class:`SealError` if it was
        not encrypted for this site by that twin."""
        try:
            sealed = base64.b64decode(env.dat, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SealError("the payload came through a relay and is not encrypted") from exc
        try:
            plain = self._box(public_key_of(sender)).decrypt(sealed)
        except nacl.exceptions.CryptoError as exc:
            raise SealError(
                f"couldn't decrypt the payload from twin {sender.id}: not encrypted for this site's key "
                f"(its twin entry's pk, or its account), or changed on the way"
            ) from exc
        try:
            return env.replace(dat=plain.decode())
        except UnicodeDecodeError as exc:
            raise SealError(f"the payload from twin {sender.id} is not text once decrypted") from exc

    def _box(self, their_key: bytes) -> nacl.public.Box:
        box = self._boxes.get(their_key)
        if box is None:
            try:
                box = nacl.public.Box(self._private_key, nacl.public.PublicKey(their_key))
            except (nacl.exceptions.ValueError, nacl.exceptions.TypeError) as exc:
                raise SealError(f"unusable encryption key {their_key.hex()}: {exc}") from exc
            self._boxes[their_key] = box
            if len(self._boxes) > KEPT_BOXES:
                self._boxes.popitem(last=False)
        else:
            self._boxes.move_to_end(their_key)
        return box


def _context(env: Envelope) -> bytes:
    return f"{env.src}\n{','.join(map(str, env.dst))}\n{env.uid}\n{env.cmd}\n".encode()
