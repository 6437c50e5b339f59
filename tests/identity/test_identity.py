"""The daemon's key from --mnemonics (phrase, SURI, hex seed), and account id text forms."""

from __future__ import annotations

import pytest
from substrateinterface import Keypair, KeypairType

from msgbusd.identity.keys import IdentityError, load_signer, new_mnemonic
from msgbusd.identity.signing import verify
from twin_resolver.accounts import account_from_text, ss58_encode
from wire.envelope import Envelope

PHRASE = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
MINI_SECRET = "fac7959dbfe72f052e5a0c3c8d6530f202b02fd8f9f5ca3580ec8deb7797479e"
SR25519_PUBLIC = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
ED25519_PUBLIC = bytes.fromhex("345071da55e5dccefaaa440339415ef9f2663338a38f7da0df21be5ab4e055ef")
# Substrate's well-known dev accounts (`subkey inspect //Alice`, with either scheme).
ALICE_SR25519 = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
ALICE_SS58 = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
ALICE_ED25519 = bytes.fromhex("88dc3417d5058ec4b4503e0c12ea1a0a89be200fe98922423d4334014fa6b0ee")

SUBSTRATE_TYPES = {"sr25519": KeypairType.SR25519, "ed25519": KeypairType.ED25519}


def _identity_error(secret: str, key_type: str = "sr25519") -> str:
    with pytest.raises(IdentityError) as caught:
        load_signer(secret, key_type)
    return str(caught.value)


@pytest.mark.parametrize(("key_type", "public"), [("sr25519", SR25519_PUBLIC), ("ed25519", ED25519_PUBLIC)])
def test_phrase_gives_the_vector_keys(key_type: str, public: bytes) -> None:
    signer = load_signer(PHRASE, key_type)
    assert signer.key_type == key_type
    assert signer.public_key == public
    expected = Keypair.create_from_mnemonic(PHRASE, crypto_type=SUBSTRATE_TYPES[key_type])
    assert signer.public_key == expected.public_key


@pytest.mark.parametrize("key_type", ["sr25519", "ed25519"])
def test_whitespace_around_the_secret_and_key_type_is_ignored(key_type: str) -> None:
    signer = load_signer(f"  {PHRASE}\n", f" {key_type.upper()} ")
    assert signer.public_key == load_signer(PHRASE, key_type).public_key


@pytest.mark.parametrize(("key_type", "public"), [("sr25519", SR25519_PUBLIC), ("ed25519", ED25519_PUBLIC)])
def test_hex_seed_is_the_mini_secret(key_type: str, public: bytes) -> None:
    assert load_signer("0x" + MINI_SECRET, key_type).public_key == public
    assert load_signer("0x" + MINI_SECRET.upper(), key_type).public_key == public


def test_sr25519_hard_derivation_matches_substrateinterface() -> None:
    signer = load_signer(PHRASE + "//Alice", "sr25519")
    assert signer.public_key == ALICE_SR25519
    assert signer.public_key == Keypair.create_from_uri(PHRASE + "//Alice").public_key


@pytest.mark.parametrize("path", ["//alice", "//Alice//stash", "//1", "/soft", "//Alice/0", "//" + "x" * 40])
def test_sr25519_paths_match_substrateinterface(path: str) -> None:
    expected = Keypair.create_from_uri(PHRASE + path, crypto_type=KeypairType.SR25519)
    assert load_signer(PHRASE + path, "sr25519").public_key == expected.public_key


def test_sr25519_derivation_from_a_hex_seed() -> None:
    assert load_signer(f"0x{MINI_SECRET}//Alice", "sr25519").public_key == ALICE_SR25519


def test_ed25519_hard_derivation() -> None:
    assert load_signer(PHRASE + "//Alice", "ed25519").public_key == ALICE_ED25519
    assert load_signer(f"0x{MINI_SECRET}//Alice", "ed25519").public_key == ALICE_ED25519
    assert load_signer(PHRASE + "//Alice//Bob", "ed25519").public_key not in (ALICE_ED25519, ED25519_PUBLIC)


@pytest.mark.parametrize(("key_type", "prefix"), [("sr25519", "73"), ("ed25519", "65")])
def test_derived_signer_signs_verifiable_envelopes(key_type: str, prefix: str) -> None:
    signer = load_signer(PHRASE + "//Alice", key_type)
    signed = signer.sign(Envelope(cmd="a.b", dst=(2,), ret="r", src=1, now=1))
    assert signed.sig.startswith(prefix)
    verify(signed, signer.public_key)


def test_bad_phrase_is_rejected_without_echoing_it() -> None:
    bad_checksum = PHRASE.replace("walk", "bottom")
    for secret in (bad_checksum, "correct horse battery staple", bad_checksum + "//Alice"):
        text = _identity_error(secret)
        assert text == "--mnemonics: not a valid BIP39 phrase (checksum or word list)"
        assert not any(word in text for word in ("drive", "obey", "horse", "staple", "Alice"))


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ("", "--mnemonics: empty secret, give a BIP39 phrase or a 0x hex seed"),
        ("   ", "--mnemonics: empty secret, give a BIP39 phrase or a 0x hex seed"),
        ("0x" + MINI_SECRET[:-2], "--mnemonics: a hex seed is 0x followed by exactly 64 hex digits"),
        ("0x" + MINI_SECRET[:-1] + "g", "--mnemonics: a hex seed is 0x followed by exactly 64 hex digits"),
        (PHRASE + "///hunter2", "--mnemonics: passwords (///) in a derivation path are not supported"),
        (PHRASE + "//Alice///hunter2", "--mnemonics: passwords (///) in a derivation path are not supported"),
        (PHRASE + "/", "--mnemonics: malformed derivation path (expected /soft or //hard)"),
        (PHRASE + "//", "--mnemonics: malformed derivation path (expected /soft or //hard)"),
    ],
)
def test_malformed_secrets(secret: str, expected: str) -> None:
    text = _identity_error(secret)
    assert text == expected
    assert not any(part in text for part in (MINI_SECRET[:16], "obey", "hunter2", "Alice"))


def test_ed25519_soft_derivation_is_refused() -> None:
    assert _identity_error(PHRASE + "//Alice/0", "ed25519") == (
        "--mnemonics: ed25519 keys support only hard (//) derivation"
    )


def test_unknown_key_type() -> None:
    assert _identity_error(PHRASE, "x") == "unknown key type 'x': use sr25519 or ed25519"
    assert isinstance(IdentityError("x"), ValueError)


def test_new_mnemonic_is_a_fresh_valid_phrase() -> None:
    first, second = new_mnemonic(), new_mnemonic()
    assert len(first.split()) == 12 and first != second
    assert load_signer(first, "sr25519").public_key != load_signer(second, "sr25519").public_key


def test_ss58_round_trip() -> None:
    assert ss58_encode(ALICE_SR25519) == ALICE_SS58
    assert account_from_text(ALICE_SS58) == ALICE_SR25519
    assert account_from_text(ss58_encode(ALICE_SR25519, ss58_format=0)) == ALICE_SR25519
    assert ss58_encode(ALICE_SR25519, ss58_format=0) != ALICE_SS58


@pytest.mark.parametrize(
    "text", [ALICE_SR25519.hex(), "0x" + ALICE_SR25519.hex(), ALICE_SR25519.hex().upper(), f" {ALICE_SS58}\n"]
)
def test_account_from_text_forms(text: str) -> None:
    assert account_from_text(text) == ALICE_SR25519


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Empty address provided"),
        ("hello", "Invalid character 'l'"),
        (ALICE_SS58[:-1] + "Z", "Invalid checksum"),
        (ALICE_SR25519.hex()[:-2], "Invalid"),
        ("F7NZ", "SS58 address of 1 bytes, not a 32-byte account id"),
    ],
)
def test_account_from_text_errors(text: str, reason: str) -> None:
    with pytest.raises(
        ValueError, match=r"neither 64 hex digits nor an SS58 address|SS58 address of"
    ) as caught:
        account_from_text(text)
    assert reason in str(caught.value)
