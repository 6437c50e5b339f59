"""Envelope signatures: the contract's test vectors (section 5) and every verification error text."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from msgbusd.identity.signing import SignatureError, Signer, challenge, verify
from wire.envelope import Envelope

MINI_SECRET = bytes.fromhex("fac7959dbfe72f052e5a0c3c8d6530f202b02fd8f9f5ca3580ec8deb7797479e")
SR25519_PUBLIC = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
ED25519_PUBLIC = bytes.fromhex("345071da55e5dccefaaa440339415ef9f2663338a38f7da0df21be5ab4e055ef")

REQUEST = Envelope(
    ver=1, uid="", cmd="zos.statistics.get", dat="e30=", src=7, dst=(15,), ret="", now=1650000000, pxy=True
)
REQUEST_CHALLENGE = "1zos.statistics.gete30=7151650000000true"
REQUEST_MD5 = "12faac2d282a681c5c6a8a26a6e073a4"
REQUEST_ED25519_SIG = (
    "652a0a3071dfeb21f3ad222e256c879129e57fbc5e6a5c4932c19be842a790c1b2"
    "f0a1fca3c24cab7d8512fc8844c7dec633971cf81233503eed9c6c9b404f130e"
)
REQUEST_SR25519_SIG = (
    "73b0947758c613af0d0a9edd069e7b992829a15fa4052dc6cccc45c17bc7ab5e68"
    "314ff56651afb44c060c7e850c6a6b0d4cb77c0471ee4e06567c219fc8362e85"
)

REPLY = Envelope(
    ver=1,
    uid="15.1",
    cmd="zos.statistics.get",
    dat="e30=",
    src=15,
    dst=(7,),
    ret="msgbus.system.reply",
    now=1650000001,
    pxy=False,
)
REPLY_CHALLENGE = "115.1zos.statistics.gete30=157msgbus.system.reply1650000001false"
REPLY_MD5 = "688900722fa3fc0b000a597fe0608e95"

ED25519 = Signer(MINI_SECRET, "ed25519")
SR25519 = Signer(MINI_SECRET, "sr25519")


def _error(env: Envelope, public_key: bytes) -> str:
    with pytest.raises(SignatureError) as caught:
        verify(env, public_key)
    return caught.value.message


# --- test vectors --------------------------------------------------------------------------------------


def test_public_keys_from_the_mini_secret() -> None:
    assert ED25519.public_key == ED25519_PUBLIC
    assert SR25519.public_key == SR25519_PUBLIC
    assert (ED25519.key_type, SR25519.key_type) == ("ed25519", "sr25519")


@pytest.mark.parametrize(
    ("env", "text", "md5"),
    [(REQUEST, REQUEST_CHALLENGE, REQUEST_MD5), (REPLY, REPLY_CHALLENGE, REPLY_MD5)],
)
def test_challenge_vectors(env: Envelope, text: str, md5: str) -> None:
    assert hashlib.md5(text.encode()).hexdigest() == md5
    assert challenge(env) == bytes.fromhex(md5)


def test_ed25519_signature_is_the_vector() -> None:
    signed = ED25519.sign(REQUEST)
    assert signed.sig == REQUEST_ED25519_SIG
    assert signed.replace(sig="") == REQUEST
    verify(signed, ED25519_PUBLIC)


def test_given_sr25519_signature_verifies() -> None:
    verify(REQUEST.replace(sig=REQUEST_SR25519_SIG), SR25519_PUBLIC)


def test_sr25519_sign_then_verify() -> None:
    first, second = SR25519.sign(REQUEST), SR25519.sign(REQUEST)
    assert first.sig != second.sig  # randomised
    for signed in (first, second):
        assert len(signed.sig) == 130 and signed.sig.startswith("73")
        verify(signed, SR25519_PUBLIC)
    verify(SR25519.sign(REPLY), SR25519_PUBLIC)


def test_sign_digest_is_type_byte_and_64_bytes() -> None:
    digest = challenge(REQUEST)
    assert ED25519.sign_digest(digest).hex() == REQUEST_ED25519_SIG
    sig = SR25519.sign_digest(digest)
    assert len(sig) == 65 and sig[:1] == b"s"


# --- what the challenge covers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"exp": 30}, {"retries": 3}, {"shm": "x"}, {"err": "boom"}, {"sig": "65"}]
)
def test_unsigned_fields_do_not_change_the_challenge(change: dict[str, object]) -> None:
    assert challenge(REQUEST.replace(**change)) == challenge(REQUEST)


@pytest.mark.parametrize(
    "change",
    [
        {"ver": 2},
        {"uid": "15.2"},
        {"cmd": "zos.other"},
        {"dat": "e31="},
        {"src": 8},
        {"dst": [15, 16]},
        {"ret": "r"},
        {"now": 1650000001},
        {"pxy": False},
    ],
)
def test_signed_fields_change_the_challenge(change: dict[str, object]) -> None:
    assert challenge(REQUEST.replace(**change)) != challenge(REQUEST)


def test_dat_override_signs_the_given_text() -> None:
    env = REQUEST.replace(dat="e30=")
    assert challenge(env, dat="{}") == challenge(env.replace(dat="{}"))
    signed = ED25519.sign(env, dat="{}")
    verify(signed, ED25519_PUBLIC, dat="{}")
    assert _error(signed, ED25519_PUBLIC) == "couldn't verify signature"


def test_lone_surrogate_is_signed_as_replacement_character() -> None:
    # Go's JSON decoder turns a lone surrogate into U+FFFD; a signature must match what a Go peer computes.
    assert challenge(REQUEST.replace(cmd="a\ud800b")) == challenge(REQUEST.replace(cmd="a\ufffdb"))


# --- verification errors, with go-rmb's texts --------------------------------------------------------


def test_empty_signature() -> None:
    assert _error(REQUEST, ED25519_PUBLIC) == (
        "signature field is empty, visit the project github repo for instructions to update"
    )


@pytest.mark.parametrize(
    ("sig", "reason"),
    [
        ("65zz", "encoding/hex: invalid byte: U+007A 'z'"),
        ("6g" + "00" * 64, "encoding/hex: invalid byte: U+0067 'g'"),
        ("65 00", "encoding/hex: invalid byte: U+0020 ' '"),
        ("65\x01", "encoding/hex: invalid byte: U+0001"),
        ("65é0", "encoding/hex: invalid byte: U+00C3 'Ã'"),  # Go reports the first UTF-8 byte
        (REQUEST_ED25519_SIG + "0", "encoding/hex: odd length hex string"),
        ("650", "encoding/hex: odd length hex string"),
        ("65g", "encoding/hex: invalid byte: U+0067 'g'"),  # an invalid last byte wins over odd length
    ],
)
def test_signature_not_hex(sig: str, reason: str) -> None:
    assert _error(REQUEST.replace(sig=sig), ED25519_PUBLIC) == f"couldn't decode signature: {reason}"


@pytest.mark.parametrize(("prefix", "shown"), [("78", "78"), ("00", "00"), ("45", "45"), ("ff", "ff")])
def test_unknown_prefix(prefix: str, shown: str) -> None:
    sig = prefix + REQUEST_ED25519_SIG[2:]
    assert _error(REQUEST.replace(sig=sig), ED25519_PUBLIC) == f"unrecognized signature prefix {shown}"


def test_prefix_is_checked_before_length() -> None:
    assert _error(REQUEST.replace(sig="78"), ED25519_PUBLIC) == "unrecognized signature prefix 78"


@pytest.mark.parametrize(
    "sig", ["65", REQUEST_ED25519_SIG[:-2], REQUEST_ED25519_SIG + "00", "73" + "00" * 63]
)
def test_wrong_length(sig: str) -> None:
    assert _error(REQUEST.replace(sig=sig), ED25519_PUBLIC) == "couldn't verify signature"


@pytest.mark.parametrize(
    "change", [{"cmd": "zos.other"}, {"dat": "e31="}, {"src": 8}, {"dst": [16]}, {"now": 1650000001}]
)
@pytest.mark.parametrize(("signer", "public"), [(ED25519, ED25519_PUBLIC), (SR25519, SR25519_PUBLIC)])
def test_tampered_field(change: dict[str, object], signer: Signer, public: bytes) -> None:
    signed = signer.sign(REQUEST)
    assert _error(signed.replace(**change), public) == "couldn't verify signature"


def test_wrong_key() -> None:
    other = Signer(bytes(32), "ed25519")
    assert _error(other.sign(REQUEST), ED25519_PUBLIC) == "couldn't verify signature"
    assert _error(ED25519.sign(REQUEST), SR25519_PUBLIC) == "couldn't verify signature"
    assert _error(SR25519.sign(REQUEST), ED25519_PUBLIC) == "couldn't verify signature"


def test_type_byte_selects_the_algorithm() -> None:
    ed_sig_marked_sr = "73" + REQUEST_ED25519_SIG[2:]
    assert _error(REQUEST.replace(sig=ed_sig_marked_sr), ED25519_PUBLIC) == "couldn't verify signature"
    sr_sig_marked_ed = "65" + REQUEST_SR25519_SIG[2:]
    assert _error(REQUEST.replace(sig=sr_sig_marked_ed), SR25519_PUBLIC) == "couldn't verify signature"


@pytest.mark.parametrize("public", [b"", ED25519_PUBLIC[:31], ED25519_PUBLIC + b"\x00"])
@pytest.mark.parametrize("sig", [REQUEST_ED25519_SIG, REQUEST_SR25519_SIG])
def test_malformed_public_key_does_not_verify(public: bytes, sig: str) -> None:
    assert _error(REQUEST.replace(sig=sig), public) == "couldn't verify signature"


def test_signature_error_carries_its_text() -> None:
    error = SignatureError("couldn't verify signature")
    assert error.message == str(error) == "couldn't verify signature"


def test_signer_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Signer(bytes(31), "ed25519")
    with pytest.raises(ValueError, match="unknown key type"):
        Signer(bytes(32), "rsa")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 bytes"):
        Signer.from_sr25519_secret(bytes(32))


def test_signer_repr_shows_no_secret() -> None:
    text = repr(ED25519)
    assert ED25519_PUBLIC.hex() in text and MINI_SECRET.hex() not in text


def test_import_does_not_load_substrateinterface() -> None:
    code = "import sys, msgbusd.identity.signing; print('substrateinterface' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
