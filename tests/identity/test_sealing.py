"""Payloads encrypted for the other end through a relay: only the two ends read them, nobody changes them."""

from __future__ import annotations

import base64

import pytest

from msgbusd.identity.sealing import Sealer, SealError, public_key_of
from msgbusd.identity.signing import Signer, verify
from twin_resolver.base import Twin
from wire.envelope import Envelope, encode_payload

ALICE_SEED, BOB_SEED, EVE_SEED = b"a" * 32, b"b" * 32, b"e" * 32


def party(twin_id: int, seed: bytes, key_type: str) -> tuple[Signer, Sealer, Twin]:
    signer = Signer(seed, key_type)  # type: ignore[arg-type]
    sealer = Sealer(signer.encryption_key())
    # An sr25519 twin publishes its encryption key (pk); an ed25519 one needs none.
    pk = sealer.public_key if key_type == "sr25519" else None
    return signer, sealer, Twin(twin_id, "", signer.public_key, encryption_key=pk)


def request(src: int, dst: int, payload: bytes = b"the payload", uid: str = "2.1") -> Envelope:
    return Envelope(uid=uid, cmd="echo", dat=encode_payload(payload), src=src, dst=(dst,), ret="r", now=1)


@pytest.mark.parametrize(
    ("alice_type", "bob_type"), [("ed25519", "ed25519"), ("sr25519", "ed25519"), ("sr25519", "sr25519")]
)
def test_only_the_destination_reads_what_the_source_sealed(alice_type: str, bob_type: str) -> None:
    _, alice, alice_twin = party(1, ALICE_SEED, alice_type)
    _, bob, bob_twin = party(2, BOB_SEED, bob_type)
    _, eve, _ = party(3, EVE_SEED, "ed25519")
    env = request(1, 2)

    sealed = alice.seal(env, bob_twin)

    assert b"the payload" not in base64.b64decode(sealed.dat)
    assert sealed.replace(dat=env.dat) == env
    assert bob.open(sealed, alice_twin) == env
    with pytest.raises(SealError, match="couldn't decrypt the payload from twin 1"):
        eve.open(sealed, alice_twin)


def test_a_message_sealed_again_is_the_same_bytes_and_different_messages_differ() -> None:
    # The receiver's de-duplication knows a re-send by its payload: sealing must not change it.
    _, alice, _ = party(1, ALICE_SEED, "ed25519")
    _, _, bob_twin = party(2, BOB_SEED, "ed25519")
    env = request(1, 2)
    assert alice.seal(env, bob_twin).dat == alice.seal(env, bob_twin).dat
    others = {request(1, 2, uid="2.2"), request(1, 2, payload=b"another"), env.replace(cmd="other")}
    assert len({alice.seal(other, bob_twin).dat for other in others} | {alice.seal(env, bob_twin).dat}) == 4


def test_what_a_relay_changes_does_not_open_and_does_not_verify() -> None:
    alice_signer, alice, alice_twin = party(1, ALICE_SEED, "ed25519")
    _, bob, bob_twin = party(2, BOB_SEED, "ed25519")
    signed = alice_signer.sign(alice.seal(request(1, 2), bob_twin))
    raw = bytearray(base64.b64decode(signed.dat))
    raw[-1] ^= 1
    changed = signed.replace(dat=base64.b64encode(bytes(raw)).decode())

    with pytest.raises(SealError, match="changed on the way"):
        bob.open(changed, alice_twin)
    with pytest.raises(Exception, match="couldn't verify signature"):
        verify(changed, alice_twin.public_key)
    verify(signed, alice_twin.public_key)


def test_a_payload_that_was_not_sealed_is_refused_with_a_reason() -> None:
    _, bob, _ = party(2, BOB_SEED, "ed25519")
    _, _, alice_twin = party(1, ALICE_SEED, "ed25519")
    with pytest.raises(SealError, match="not encrypted"):
        bob.open(request(1, 2).replace(dat="not base64!"), alice_twin)
    with pytest.raises(SealError, match="couldn't decrypt"):
        bob.open(request(1, 2), alice_twin)


def test_the_key_of_a_twin_is_its_pk_else_its_ed25519_account_converted() -> None:
    signer = Signer(ALICE_SEED, "ed25519")
    converted = bytes(signer.encryption_key().public_key)
    assert public_key_of(Twin(1, "", signer.public_key)) == converted
    assert public_key_of(Twin(1, "", signer.public_key, encryption_key=b"k" * 32)) == b"k" * 32
    # Not a point of the curve: no key to encrypt for, and the error says what to add.
    with pytest.raises(SealError, match="needs a pk"):
        public_key_of(Twin(7, "", bytes.fromhex("02" + "00" * 31)))
