"""Properties of the wire codec and of signatures, over inputs hypothesis generates.

The codec must turn any input into an envelope or one typed error (:class:`EnvelopeDecodeError`), and write
back what it read; a signature must cover exactly the fields the contract signs, and whatever is wrong with a
signature must surface as :class:`SignatureError`, never as another exception.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from msgbusd.identity.keys import IdentityError, load_signer
from msgbusd.identity.signing import SIGNATURE_LENGTH, SignatureError, Signer, challenge, verify
from wire.envelope import Envelope, EnvelopeDecodeError

PHRASE = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
SIGNERS = {kind: load_signer(PHRASE, kind) for kind in ("ed25519", "sr25519")}
OTHER_SIGNER = load_signer(PHRASE + "//other", "sr25519")

WIRE_KINDS = {
    "ver": "int",
    "uid": "str",
    "cmd": "str",
    "exp": "int",
    "try": "int",
    "dat": "str",
    "src": "int",
    "dst": "ints",
    "ret": "str",
    "shm": "str",
    "now": "int",
    "pxy": "bool",
    "err": "str",
    "sig": "str",
}
# No example database in the work tree; signing is slow enough to trip the default health check.
EXAMPLES = settings(database=None, suppress_health_check=[HealthCheck.too_slow])
STRING_ATTRS = ("uid", "cmd", "dat", "ret", "shm", "err", "sig")
SIGNED_ATTRS = ("ver", "uid", "cmd", "dat", "src", "dst", "ret", "now", "pxy")
UNSIGNED_ATTRS = ("exp", "retries", "shm", "err")

# Text that UTF-8 can carry: lone surrogates are covered by their own tests below.
texts = st.text(st.characters(codec="utf-8"), max_size=40)
wire_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

envelopes = st.builds(
    Envelope,
    ver=wire_ints,
    uid=texts,
    cmd=texts,
    exp=wire_ints,
    retries=wire_ints,
    dat=texts,
    src=wire_ints,
    dst=st.lists(wire_ints, max_size=4).map(tuple),
    ret=texts,
    shm=texts,
    now=wire_ints,
    pxy=st.booleans(),
    err=texts,
    sig=texts,
)


def _wrong_value(kind: str) -> st.SearchStrategy[Any]:
    """A non-null JSON value of any kind but ``kind`` (null is the zero value, so it is not wrong)."""
    choices: list[st.SearchStrategy[Any]] = [
        st.floats(allow_nan=False),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    ]
    if kind != "int":
        choices.append(st.integers())
    if kind != "str":
        choices.append(st.text(max_size=8))
    if kind != "bool":
        choices.append(st.booleans())
    if kind == "ints":
        # A list, but with a member that is not an integer.
        choices.append(st.lists(st.integers(), max_size=3).map(lambda xs: [*xs, "1"]))
        choices.append(st.lists(st.integers(), max_size=3).map(lambda xs: [True, *xs]))
    else:
        choices.append(st.lists(st.integers(), max_size=3))
    return st.one_of(choices)


@st.composite
def mistyped_objects(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A wire object (keys in random case) whose one field, named in the result, has a wrong type."""
    obj = {key: value for key, value in draw(envelopes).to_wire().items() if draw(st.booleans())}
    key = draw(st.sampled_from(sorted(WIRE_KINDS)))
    spelled = "".join(c.upper() if draw(st.booleans()) else c for c in key)
    obj.pop(key, None)
    obj[spelled] = draw(_wrong_value(WIRE_KINDS[key]))
    return key, obj


def _decodes_or_fails_typed(raw: bytes) -> Envelope | None:
    try:
        return Envelope.decode(raw)
    except EnvelopeDecodeError as exc:
        assert exc.raw == raw
        return None


# --- the codec --------------------------------------------------------------------------------------------


@EXAMPLES
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_the_decode_error(raw: bytes) -> None:
    _decodes_or_fails_typed(raw)


@EXAMPLES
@given(json_values)
def test_arbitrary_json_values_decode_or_raise_the_decode_error(value: Any) -> None:
    env = _decodes_or_fails_typed(json.dumps(value).encode())
    if env is not None:
        assert isinstance(value, dict)


def _standard_decode(raw: bytes) -> Envelope | str:
    """What decoding ``raw`` with the standard library's parser alone gives: the envelope, or the error."""
    try:
        return Envelope.from_wire(json.loads(raw), raw)
    except (ValueError, RecursionError) as exc:
        return str(exc) if isinstance(exc, EnvelopeDecodeError) else "invalid JSON"


@EXAMPLES
@given(envelopes)
def test_the_encoding_is_the_standard_librarys_byte_for_byte(env: Envelope) -> None:
    # The daemon encodes with orjson where it is installed; the client library with json alone.
    assert env.encode() == json.dumps(env.to_wire(), separators=(",", ":"), ensure_ascii=False).encode()


@EXAMPLES
@given(
    st.dictionaries(
        st.sampled_from(sorted(WIRE_KINDS)),
        json_values
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=True)
        | st.lists(st.integers(-(2**70), 2**70)),
        max_size=6,
    )
)
def test_decoding_gives_what_the_standard_librarys_parser_gives(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    try:
        decoded: Envelope | str = Envelope.decode(raw)
    except EnvelopeDecodeError as exc:
        decoded = "invalid JSON" if exc.reason.startswith("invalid JSON") else str(exc)
    assert decoded == _standard_decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"exp": 1180591620717411303424}',
        b'{"dst": [1, -1180591620717411303424]}',
        b'{"now": 18446744073709551615}',
        b'{"src": 1e400}',
        b'{"exp": NaN}',
        b'{"cmd": "\\ud800"}',
        '{"cmd": "é"}'.encode("utf-16"),
    ],
)
def test_what_orjson_reads_otherwise_is_read_as_the_standard_library_reads_it(raw: bytes) -> None:
    try:
        decoded: Envelope | str = Envelope.decode(raw)
    except EnvelopeDecodeError as exc:
        decoded = "invalid JSON" if exc.reason.startswith("invalid JSON") else str(exc)
    assert decoded == _standard_decode(raw)


@EXAMPLES
@given(st.text(max_size=200))
def test_arbitrary_text_decodes_or_raises_the_decode_error(text: str) -> None:
    with contextlib.suppress(EnvelopeDecodeError):
        Envelope.decode(text)


@EXAMPLES
@given(envelopes, st.integers(min_value=0, max_value=400))
def test_truncated_envelopes_raise_the_decode_error(env: Envelope, cut: int) -> None:
    raw = env.encode()
    assume(cut < len(raw))
    with pytest.raises(EnvelopeDecodeError):
        Envelope.decode(raw[:cut])


@EXAMPLES
@given(mistyped_objects())
def test_a_wrongly_typed_field_is_a_decode_error_naming_it(case: tuple[str, dict[str, Any]]) -> None:
    key, obj = case
    with pytest.raises(EnvelopeDecodeError) as caught:
        Envelope.decode(json.dumps(obj).encode())
    assert key in caught.value.reason.lower()


@EXAMPLES
@given(envelopes)
def test_encode_then_decode_gives_the_same_envelope(env: Envelope) -> None:
    raw = env.encode()
    assert list(json.loads(raw)) == list(WIRE_KINDS)
    assert Envelope.decode(raw) == env
    assert Envelope.decode(raw).encode() == raw


def _any_value(kind: str) -> st.SearchStrategy[Any]:
    """A value for a field of ``kind``: of its kind (in range or not, ASCII or not), of another, or null."""
    right = {
        "int": st.sampled_from([-(2**63) - 1, 2**63, -(2**70), 2**70]) | wire_ints,
        "str": st.text(max_size=12)
        | st.text(st.characters(max_codepoint=127), max_size=12)
        | st.just("\ud800"),
        "bool": st.booleans(),
        "ints": st.lists(wire_ints | st.integers(-(2**70), 2**70), max_size=3),
    }[kind]
    return st.one_of(right, _wrong_value(kind), st.none())


@st.composite
def complete_objects(draw: st.DrawFn) -> dict[str, Any]:
    """The 14 keys of an envelope as written (ASCII text), some of them (often none) with another value."""
    ascii_text = st.text(st.characters(max_codepoint=127), max_size=40)
    obj = draw(envelopes).replace(**{attr: draw(ascii_text) for attr in STRING_ATTRS}).to_wire()
    for key in draw(st.lists(st.sampled_from(sorted(WIRE_KINDS)), max_size=2)):
        obj[key] = draw(_any_value(WIRE_KINDS[key]))
    return obj


def _outcome(raw: bytes) -> Envelope | str:
    try:
        return Envelope.decode(raw)
    except EnvelopeDecodeError as exc:
        return exc.reason.lower()


def _decodes_as_with_keys_in_upper_case(obj: dict[str, Any]) -> bool:
    # The 14 keys as envelopes are written take a shorter way than any other spelling of them.
    written = json.dumps(obj).encode()
    spelled_otherwise = json.dumps({key.upper(): value for key, value in obj.items()}).encode()
    return _outcome(written) == _outcome(spelled_otherwise)


@EXAMPLES
@given(complete_objects())
def test_an_object_with_every_key_decodes_as_with_its_keys_in_upper_case(obj: dict[str, Any]) -> None:
    assert _decodes_as_with_keys_in_upper_case(obj)


def test_every_key_with_every_kind_of_value_decodes_as_with_the_keys_in_upper_case() -> None:
    written = Envelope(uid="1.2", cmd="c", dat="ZA==", src=1, dst=(2,), ret="r", sig="ab").to_wire()
    values = [None, 0, -(2**63), 2**63 - 1, -(2**63) - 1, 2**63, 2**70, True, 1.5, "", "x", "é", "\ud800"]
    values += [[], [1, 2], [1, True], [1, "1"], [2**70], {}, {"a": 1}]
    different = [
        (key, value)
        for key in WIRE_KINDS
        for value in values
        if not _decodes_as_with_keys_in_upper_case({**written, key: value})
    ]
    assert different == []


@EXAMPLES
@given(
    envelopes, st.dictionaries(st.text(max_size=6).filter(lambda k: k.lower() not in WIRE_KINDS), json_values)
)
def test_unknown_keys_and_key_case_do_not_change_the_envelope(env: Envelope, extra: dict[str, Any]) -> None:
    obj = {key.upper(): value for key, value in env.to_wire().items()}
    obj.update(extra)
    assert Envelope.decode(json.dumps(obj).encode()) == env


def test_deeply_nested_json_is_a_decode_error() -> None:
    with pytest.raises(EnvelopeDecodeError):
        Envelope.decode(b"[" * 100_000)


@EXAMPLES
@given(st.sampled_from(["uid", "cmd", "dat", "ret", "shm", "err", "sig"]), st.integers(0xD800, 0xDFFF))
def test_every_decoded_envelope_can_be_encoded_again(key: str, surrogate: int) -> None:
    raw = f'{{"{key}": "\\u{surrogate:04x}"}}'.encode()
    env = Envelope.decode(raw)
    assert Envelope.decode(env.encode()) == env


# --- signatures -------------------------------------------------------------------------------------------

signers = st.sampled_from(sorted(SIGNERS)).map(SIGNERS.__getitem__)


def _changed(env: Envelope, attr: str, draw: st.DrawFn) -> Envelope:
    """``env`` with ``attr`` given a different value (for ``dst``, one whose digits differ once joined)."""
    if attr == "pxy":
        return env.replace(pxy=not env.pxy)
    if attr == "dst":
        joined = "".join(str(d) for d in env.dst)
        dst = draw(st.lists(wire_ints, max_size=4).filter(lambda d: "".join(map(str, d)) != joined))
        return env.replace(dst=dst)
    current = getattr(env, attr)
    strategy = wire_ints if isinstance(current, int) else texts
    return env.replace(**{attr: draw(strategy.filter(lambda v: v != current))})


@EXAMPLES
@given(envelopes, signers)
def test_a_signed_envelope_verifies(env: Envelope, signer: Signer) -> None:
    signed = signer.sign(env)
    assert len(bytes.fromhex(signed.sig)) == SIGNATURE_LENGTH
    verify(signed, signer.public_key)
    verify(Envelope.decode(signed.encode()), signer.public_key)


@EXAMPLES
@given(envelopes, signers, st.sampled_from(SIGNED_ATTRS), st.data())
def test_changing_a_signed_field_fails_verification(
    env: Envelope, signer: Signer, attr: str, data: st.DataObject
) -> None:
    signed = signer.sign(env)
    tampered = _changed(signed, attr, data.draw)
    with pytest.raises(SignatureError) as caught:
        verify(tampered, signer.public_key)
    assert caught.value.message == "couldn't verify signature"


@EXAMPLES
@given(envelopes, signers, st.sampled_from(UNSIGNED_ATTRS), st.data())
def test_fields_outside_the_signature_can_change_without_failing_it(
    env: Envelope, signer: Signer, attr: str, data: st.DataObject
) -> None:
    current = getattr(env, attr)
    value = data.draw((wire_ints if isinstance(current, int) else texts).filter(lambda v: v != current))
    verify(signer.sign(env).replace(**{attr: value}), signer.public_key)


@EXAMPLES
@given(st.lists(st.integers(0, 99), min_size=2, max_size=4))
def test_regrouping_dst_digits_keeps_the_signature(dst: list[int]) -> None:
    # The challenge joins dst without separators (the contract's definition): [1, 23] signs like [12, 3].
    joined = "".join(map(str, dst))
    env = SIGNERS["ed25519"].sign(Envelope(cmd="c", src=1, dst=tuple(dst), now=1))
    assume(str(int(joined)) == joined and len(dst) > 1)
    regrouped = env.replace(dst=(int(joined),))
    verify(regrouped, SIGNERS["ed25519"].public_key)


@EXAMPLES
@given(envelopes, signers, st.integers(0, SIGNATURE_LENGTH - 1), st.integers(1, 255))
def test_changing_a_signature_byte_fails_verification(
    env: Envelope, signer: Signer, index: int, flip: int
) -> None:
    raw = bytearray.fromhex(signer.sign(env).sig)
    raw[index] ^= flip
    with pytest.raises(SignatureError):
        verify(env.replace(sig=raw.hex()), signer.public_key)


@EXAMPLES
@given(envelopes, signers)
def test_a_signature_by_another_key_fails_verification(env: Envelope, signer: Signer) -> None:
    with pytest.raises(SignatureError):
        verify(OTHER_SIGNER.sign(env), signer.public_key)


@EXAMPLES
@given(
    envelopes,
    st.one_of(
        st.text(),
        st.text("0123456789abcdefABCDEF"),
        st.binary(max_size=80).map(bytes.hex),
        st.binary(min_size=64, max_size=64).map(lambda b: (b"e" + b).hex()),
        st.binary(min_size=64, max_size=64).map(lambda b: (b"s" + b).hex()),
    ),
    st.binary(min_size=0, max_size=40),
)
def test_arbitrary_signatures_raise_only_signature_error(env: Envelope, sig: str, public_key: bytes) -> None:
    with pytest.raises(SignatureError):
        verify(env.replace(sig=sig), public_key)
    with pytest.raises(SignatureError):
        verify(env.replace(sig=sig), SIGNERS["sr25519"].public_key)


@EXAMPLES
@given(st.text(max_size=30), st.text(max_size=30))
def test_lone_surrogates_are_signed_as_a_go_peer_reads_them(before: str, after: str) -> None:
    # Go decodes "\ud800" as U+FFFD: the challenge is that of the replaced text, and it never raises.
    env = Envelope(cmd=before + "\ud800" + after)
    assert challenge(env) == challenge(env.replace(cmd=before + "\ufffd" + after))


@EXAMPLES
@given(st.text(max_size=60), st.sampled_from(["sr25519", "ed25519", "ED25519", "x"]))
def test_arbitrary_secrets_give_a_signer_or_the_identity_error(secret: str, key_type: str) -> None:
    try:
        signer = load_signer(secret, key_type)
    except IdentityError:
        return
    assert len(signer.public_key) == 32


@EXAMPLES
@given(st.text(max_size=40), st.sampled_from(["sr25519", "ed25519"]))
def test_arbitrary_derivation_paths_give_a_signer_or_the_identity_error(path: str, key_type: str) -> None:
    try:
        signer = load_signer(f"{PHRASE}/{path}", key_type)
    except IdentityError:
        return
    assert len(signer.public_key) == 32
