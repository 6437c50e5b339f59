"""The msgbus command, in process with typer's CliRunner and as a real process for serve's signal handling."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from client.cli import app
from msgbusd.identity.sealing import public_key_of
from tests.support.servers import free_port
from twin_resolver.base import Twin
from wire import keys
from wire.envelope import Envelope, decode_payload, encode_payload

PHRASE = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
MSGBUS = Path(sys.executable).parent / "msgbus"

runner = CliRunner()

# (payload, error) a destination answers with, or None when it stays silent.
Responder = Callable[[Envelope, int], tuple[bytes, str] | None]


@contextmanager
def daemon(redis_url: str, respond: Responder | None = None) -> Iterator[list[Envelope]]:
    """Play the local daemon for one request: each destination answers with ``respond`` (default: echo)."""
    seen: list[Envelope] = []

    def serve_one() -> None:
        with redis.Redis.from_url(redis_url) as conn:
            popped = conn.blpop([keys.LOCAL], timeout=10)
            if popped is None:
                return
            request = Envelope.decode(popped[1])
            seen.append(request)
            for twin in request.dst:
                answer = (request.payload, "") if respond is None else respond(request, twin)
                if answer is not None:
                    data, err = answer
                    reply = request.replace(
                        uid=f"{twin}.1", src=twin, dst=[1], dat=encode_payload(data), err=err
                    )
                    conn.lpush(request.ret, reply.encode())

    thread = threading.Thread(target=serve_one)
    thread.start()
    try:
        yield seen
    finally:
        thread.join(timeout=15)


def lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines()]


def push_request(conn: redis.Redis, cmd: str, data: bytes, n: int = 1) -> None:
    request = Envelope(
        uid=f"5.{n}", cmd=cmd, dat=encode_payload(data), src=9, dst=(5,), ret=keys.REPLY, now=int(time.time())
    )
    conn.lpush(keys.command_queue(cmd), request.encode())


def pushed_replies(conn: redis.Redis) -> dict[str, Envelope]:
    return {reply.uid: reply for reply in map(Envelope.decode, conn.lrange(keys.REPLY, 0, -1))}


# --- send and wait -------------------------------------------------------------------------------------


def test_send_prints_one_json_line_per_destination_in_order(redis_url: str) -> None:
    def respond(request: Envelope, twin: int) -> tuple[bytes, str] | None:
        return (b"\xff\x00", "") if twin == 7 else (f"hi from {twin}: ".encode() + request.payload, "")

    args = ["send", "--dst", "8", "--dst", "7", "--cmd", "greet", "--data", "hé", "--exp", "20", "--try", "0"]
    with daemon(redis_url, respond) as seen:
        result = runner.invoke(app, [*args, "--timeout", "10", "--redis", redis_url])

    assert result.exit_code == 0, result.output
    assert lines(result.stdout) == [
        {"src": 8, "uid": "8.1", "data": "hi from 8: hé", "base64": False, "error": ""},
        {"src": 7, "uid": "7.1", "data": "/wA=", "base64": True, "error": ""},
    ]
    (request,) = seen
    assert (request.dst, request.cmd, request.exp, request.retries) == ((8, 7), "greet", 20, 0)


def test_send_reads_the_payload_from_stdin(redis_url: str) -> None:
    with daemon(redis_url):
        result = runner.invoke(
            app,
            ["send", "--dst", "4", "--cmd", "echo", "--timeout", "10", "--redis", redis_url],
            input=b"from stdin",
        )
    assert result.exit_code == 0, result.output
    assert lines(result.stdout)[0]["data"] == "from stdin"


def test_send_exits_1_when_a_reply_carries_an_error(redis_url: str) -> None:
    def respond(request: Envelope, twin: int) -> tuple[bytes, str] | None:
        return (b"", "ValueError: nope") if twin == 3 else (b"ok", "")

    with daemon(redis_url, respond):
        args = ["send", "--dst", "2", "--dst", "3", "--cmd", "c", "--data", "", "--timeout", "10"]
        result = runner.invoke(app, [*args, "--redis", redis_url])
    assert result.exit_code == 1
    assert [(line["src"], line["error"]) for line in lines(result.stdout)] == [
        (2, ""),
        (3, "ValueError: nope"),
    ]


def test_send_exits_2_on_timeout_after_printing_what_arrived(redis_url: str) -> None:
    def respond(request: Envelope, twin: int) -> tuple[bytes, str] | None:
        return (b"here", "") if twin == 2 else None  # twin 3 never answers

    with daemon(redis_url, respond) as seen:
        args = ["send", "--dst", "2", "--dst", "3", "--cmd", "c", "--data", "x", "--timeout", "0.5"]
        result = runner.invoke(app, [*args, "--redis", redis_url])
    assert result.exit_code == 2
    assert [line["src"] for line in lines(result.stdout)] == [2]
    assert result.stderr.startswith("error: timed out after 0.5s: no reply from twin 3")
    assert f"msgbus wait {seen[0].ret} --count 1" in result.stderr
    assert "Traceback" not in result.output


def test_wait_pops_replies_from_a_return_queue(redis_url: str, sync_redis: redis.Redis) -> None:
    ret = "b5bd4a1f-54e8-4e8b-a44b-8fd0c1d7cf61"
    for twin in (4, 6):
        sync_redis.lpush(ret, Envelope(uid=f"{twin}.1", src=twin, dat=encode_payload(b"r%d" % twin)).encode())
    result = runner.invoke(app, ["wait", ret, "--count", "2", "--timeout", "5", "--redis", redis_url])
    assert result.exit_code == 0, result.output
    assert [(line["src"], line["data"]) for line in lines(result.stdout)] == [(4, "r4"), (6, "r6")]

    result = runner.invoke(app, ["wait", ret, "--timeout", "0", "--redis", redis_url])
    assert result.exit_code == 2
    assert "0 of 1 replies arrived" in result.stderr


# --- serve ---------------------------------------------------------------------------------------------


def test_serve_exec_replies_with_the_program_output(redis_url: str, sync_redis: redis.Redis) -> None:
    push_request(sync_redis, "upper", b"hello", n=1)
    push_request(sync_redis, "upper", b"world", n=2)
    result = runner.invoke(app, ["serve", "upper", "--exec", "tr a-z A-Z", "--burst", "--redis", redis_url])
    assert result.exit_code == 0, result.output

    replies = pushed_replies(sync_redis)
    assert {uid: decode_payload(reply.dat) for uid, reply in replies.items()} == {
        "5.1": b"HELLO",
        "5.2": b"WORLD",
    }
    assert all(reply.err == "" and reply.src == 5 and reply.dst == (9,) for reply in replies.values())


def test_serve_exec_failures_become_reply_errors(redis_url: str, sync_redis: redis.Redis) -> None:
    script = (
        "import os, sys\n"
        "data = sys.stdin.read()\n"
        "env = os.environ\n"
        "if data == 'env': print(env['MSGBUS_SRC'], env['MSGBUS_UID'], env['MSGBUS_CMD'])\n"
        "elif data == 'quiet': sys.exit(4)\n"
        "else: sys.stderr.write('  bad input: ' + data + '\\n'); sys.exit(3)\n"
    )
    program = shlex.join([sys.executable, "-c", script])
    for n, data in enumerate([b"env", b"quiet", b"oops"], start=1):
        push_request(sync_redis, "check", data, n=n)
    result = runner.invoke(
        app, ["serve", "check", "--exec", program, "--workers", "2", "--burst", "--redis", redis_url]
    )
    assert result.exit_code == 0, result.output

    replies = pushed_replies(sync_redis)
    assert (replies["5.1"].err, decode_payload(replies["5.1"].dat)) == ("", b"9 5.1 check\n")
    assert replies["5.2"].err == "exit status 4"
    assert replies["5.3"].err == "bad input: oops"


@pytest.mark.processes
def test_serve_stops_gracefully_on_sigterm(redis_url: str, sync_redis: redis.Redis) -> None:
    process = subprocess.Popen(
        [str(MSGBUS), "serve", "rev", "--exec", "rev", "--redis", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        push_request(sync_redis, "rev", b"abc\n")
        popped = sync_redis.brpop([keys.REPLY], timeout=30)
        assert popped is not None, "the serve process did not reply"
        assert decode_payload(Envelope.decode(popped[1]).dat) == b"cba\n"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert b"SIGTERM" in stderr


# --- identity ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_type", "public_key"),
    [
        ("sr25519", "46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a"),
        ("ed25519", "345071da55e5dccefaaa440339415ef9f2663338a38f7da0df21be5ab4e055ef"),
    ],
)
def test_identity_prints_public_key_and_address(key_type: str, public_key: str) -> None:
    result = runner.invoke(app, ["identity", "--mnemonics", PHRASE, "--key-type", key_type])
    assert result.exit_code == 0, result.output
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert fields["public key"].strip() == public_key
    assert fields["key type"].strip() == key_type
    assert fields["address"].strip().startswith("5")
    # The encryption key other sites use through a relay: for ed25519, the account's key converted.
    pk = bytes.fromhex(fields["pk"].strip())
    assert len(pk) == 32
    if key_type == "ed25519":
        assert pk == public_key_of(Twin(id=1, address="", public_key=bytes.fromhex(public_key)))


def test_identity_from_environment_and_new() -> None:
    from_env = runner.invoke(app, ["identity"], env={"MSGBUS_MNEMONICS": PHRASE})
    assert "46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a" in from_env.stdout

    result = runner.invoke(app, ["identity", "--new"], env={"MSGBUS_MNEMONICS": ""})
    assert result.exit_code == 0, result.output
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines())
    mnemonic = fields["mnemonic"].strip()
    assert len(mnemonic.split()) in (12, 24)
    again = runner.invoke(app, ["identity", "--mnemonics", mnemonic])
    assert fields["public key"] in again.stdout


def test_identity_errors_are_one_line() -> None:
    result = runner.invoke(app, ["identity"], env={"MSGBUS_MNEMONICS": ""})
    assert (result.exit_code, result.stderr) == (
        2,
        "error: give --mnemonics (or set MSGBUS_MNEMONICS), or --new\n",
    )
    result = runner.invoke(app, ["identity", "--mnemonics", "not a phrase"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    result = runner.invoke(app, ["identity", "--new", "--mnemonics", PHRASE])
    assert result.exit_code == 2


def test_identity_twin_lookup_errors_name_the_source() -> None:
    # The public chain cannot be reached from the tests: a port nothing listens on stands for it.
    chain = f"ws://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["identity", "--mnemonics", PHRASE, "--substrate", chain])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(f"error: no twin for this key at {chain}: ")
    assert result.stderr.count("\n") == 1
    assert "public key: 46ebddef" in result.stdout, "the key is printed before the look-up"
    result = runner.invoke(app, ["identity", "--mnemonics", PHRASE, "--substrate", "ftp://chain"])
    assert result.exit_code == 2 and "unsupported twin source URL 'ftp://chain'" in result.stderr


# --- usage and connection errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["send", "--cmd", "c", "--data", "x"], "Missing option '--dst'"),
        (["send", "--dst", "0", "--cmd", "c", "--data", "x"], "--dst"),
        (["send", "--dst", "x", "--cmd", "c", "--data", "x"], "--dst"),
        (["send", "--dst", "1", "--cmd", "c", "--try", "-1", "--data", "x"], "--try"),
        (["send", "--dst", "1", "--cmd", "", "--data", "x"], "error: the command must not be empty"),
        (["wait", "r", "--count", "0"], "--count"),
        (["serve", "c"], "Missing option '--exec'"),
        (["serve", "c", "--exec", ""], "error: --exec: no program to run"),
        (
            ["serve", "c", "--exec", "/nonexistent/prog -x"],
            "error: --exec: program not found: /nonexistent/prog",
        ),
        (["serve", "c", "--exec", "'unbalanced"], "error: --exec: No closing quotation"),
        (
            ["send", "--dst", "1", "--cmd", "c", "--data", "x", "--redis", "foo://x"],
            "error: invalid Redis URL",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(args: list[str], message: str, redis_url: str) -> None:
    env = {"MSGBUS_REDIS": redis_url}
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["send", "--dst", "1", "--cmd", "c", "--data", "x"],
        ["wait", "r"],
        ["serve", "c", "--exec", "cat"],
    ],
)
def test_unreachable_redis_is_a_one_line_error(args: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = runner.invoke(app, [*args, "--redis", url])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot connect to Redis at {url}: ")
    assert result.stderr.count("\n") == 1


def test_the_console_script_is_installed() -> None:
    result = subprocess.run([str(MSGBUS), "--help"], capture_output=True, timeout=30, env=dict(os.environ))
    assert result.returncode == 0
    for command in (b"send", b"wait", b"serve", b"identity"):
        assert command in result.stdout
