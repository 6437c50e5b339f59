from __future__ import annotations

import json
import subprocess
import sys

import pytest

from msgbusd.door.validation import validate
from msgbusd.errors import InvalidMessage
from wire.envelope import Envelope, EnvelopeDecodeError, decode_payload, encode_payload
from wire.error_texts import go_duration, invalid_message_text

WIRE_ORDER = [
    "ver",
    "uid",
    "cmd",
    "exp",
    "try",
    "dat",
    "src",
    "dst",
    "ret",
    "shm",
    "now",
    "pxy",
    "err",
    "sig",
]


def test_encode_writes_all_fourteen_keys_in_wire_order() -> None:
    encoded = Envelope(cmd="a.b", dst=(3, 4), retries=2).encode()
    decoded = json.loads(encoded)
    assert list(decoded) == WIRE_ORDER
    assert decoded["try"] == 2
    assert decoded["dst"] == [3, 4]
    assert decoded["pxy"] is False


def test_empty_envelope_still_writes_every_key() -> None:
    assert list(json.loads(Envelope().encode())) == WIRE_ORDER


def test_round_trip_keeps_every_field() -> None:
    env = Envelope(
        ver=1,
        uid="5.1",
        cmd="c",
        exp=10,
        retries=3,
        dat="aGk=",
        src=7,
        dst=(5,),
        ret="r",
        shm="s",
        now=123,
        pxy=True,
        err="e",
        sig="ab",
    )
    assert Envelope.decode(env.encode()) == env


def test_decode_matches_keys_case_insensitively_and_ignores_unknown_keys() -> None:
    env = Envelope.decode(b'{"VER":1,"Cmd":"x","TRY":4,"Dst":[9],"extra":{"a":1}}')
    assert (env.ver, env.cmd, env.retries, env.dst) == (1, "x", 4, (9,))


def test_missing_and_null_keys_take_zero_values() -> None:
    env = Envelope.decode(b'{"cmd":"x","dst":null,"pxy":null,"uid":null}')
    assert env == Envelope(ver=0, cmd="x")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"src":"5"}', "field 'src': expected an integer, got a string"),
        (b'{"dst":[1,"2"]}', "field 'dst': expected a list of integers"),
        (b'{"dst":3}', "field 'dst': expected a list of integers, got a number"),
        (b'{"pxy":1}', "field 'pxy': expected a boolean, got a number"),
        (b'{"ver":1.5}', "field 'ver': expected an integer, got a number"),
        (b'{"ver":true}', "field 'ver': expected an integer, got a boolean"),
        (b'{"cmd":[]}', "field 'cmd': expected a string, got an array"),
        (b"[1,2]", "expected a JSON object, got an array"),
        (b"not json", "invalid JSON"),
        (b"", "invalid JSON"),
        (b"\xff\xfe", "invalid JSON"),
    ],
)
def test_wrong_types_are_typed_decode_errors_that_keep_the_raw_bytes(body: bytes, fragment: str) -> None:
    with pytest.raises(EnvelopeDecodeError) as caught:
        Envelope.decode(body)
    assert fragment in caught.value.reason
    assert caught.value.raw == body


def test_replace_returns_a_new_envelope_and_keeps_the_old_one() -> None:
    env = Envelope(cmd="x", dst=(1,))
    changed = env.replace(dst=[2, 3], cmd="y")
    assert changed.dst == (2, 3) and changed.cmd == "y"
    assert env.dst == (1,) and env.cmd == "x"
    assert changed == Envelope(cmd="y", dst=(2, 3)) and hash(changed) == hash(Envelope(cmd="y", dst=(2, 3)))
    with pytest.raises(TypeError, match="no field 'command'"):
        env.replace(command="y")


def test_payload_helpers_use_standard_base64_with_padding() -> None:
    assert encode_payload(b"{}") == "e30="
    assert Envelope(dat="e30=").payload == b"{}"
    assert Envelope().with_payload(b"hi").dat == "aGk="
    with pytest.raises(ValueError, match="not base64"):
        decode_payload("***")


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (Envelope(ver=2, cmd="c", dst=(1,), ret="r"), "protocol version mismatch"),
        (Envelope(cmd="", dst=(1,), ret="r"), "missing command request"),
        (Envelope(cmd="c", dst=(), ret="r"), "missing twin destination"),
        (Envelope(cmd="c", dst=(1,), ret=""), "return queue not defined"),
        (Envelope(ver=0, cmd="", dst=(), ret=""), "protocol version mismatch"),
    ],
)
def test_validation_reports_the_first_failing_check_with_go_rmb_text(env: Envelope, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        validate(env)
    assert caught.value.reason == reason
    assert caught.value.wire_text == f"received invalid message: {reason}"


def test_validation_passes_a_complete_message_and_proxy_messages_need_no_destination() -> None:
    validate(Envelope(cmd="c", dst=(1,), ret="r"))
    validate(Envelope(cmd="c", ret="r", pxy=True), need_destination=False)


def test_invalid_message_text() -> None:
    assert invalid_message_text("x") == "received invalid message: x"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (1, "1s"),
        (61.25, "1m1.25s"),
        (65, "1m5s"),
        (7200, "2h0m0s"),
        (3723.5, "1h2m3.5s"),
    ],
)
def test_durations_are_formatted_like_go(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_without_orjson_the_standard_library_encodes_and_parses_the_same() -> None:
    # The client library's install has no orjson: wire.envelope runs on json alone, with the same bytes.
    script = (
        "import sys; sys.modules['orjson'] = None\n"
        "from wire.envelope import Envelope, _orjson\n"
        "assert _orjson is None\n"
        "env = Envelope(uid='2.1', cmd='é\\n', dat='AA==', src=1, dst=(2, 3), now=5)\n"
        "sys.stdout.buffer.write(env.encode())\n"
        "assert Envelope.decode(env.encode()) == env\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    env = Envelope(uid="2.1", cmd="é\n", dat="AA==", src=1, dst=(2, 3), now=5)
    assert result.stdout == env.encode()
