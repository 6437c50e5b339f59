"""msgbusd as an operator meets it: flags, one-line start-up errors, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import typer

from msgbusd.site.cli import parse_listen
from testing.local_sites import LocalCluster, SiteProcess, free_port, wait_until
from twin_resolver.base import Twin
from twin_resolver.static import write_twin_file
from wire import keys
from wire.envelope import Envelope

SEED = "0x" + "22" * 32


@pytest.fixture
def twins_file(tmp_path: Path) -> Path:
    from msgbusd.identity.keys import load_signer

    path = tmp_path / "twins.json"
    write_twin_file(path, [Twin(5, "127.0.0.1:1", load_signer(SEED, "sr25519").public_key)])
    return path


def run_msgbusd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "MSGBUS_MNEMONICS"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "msgbusd", *args], capture_output=True, text=True, timeout=30, env=full_env
    )


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("[::]:8051", ("::", 8051)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
        ("[::1]:9000", ("::1", 9000)),
        (":8051", ("::", 8051)),
    ],
)
def test_listen_addresses(value: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(value) == parsed


@pytest.mark.parametrize("value", ["8051", "host:", "::1:8051", "h:99999", "h:0"])
def test_bad_listen_addresses(value: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_listen(value)


def test_missing_mnemonics_is_a_clear_error() -> None:
    result = run_msgbusd("--twin", "5")
    assert result.returncode == 2
    assert (
        "Error: Invalid value: missing --mnemonics (or the MSGBUS_MNEMONICS environment variable, "
        "or --mnemonics-file)" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_unknown_flag_is_named() -> None:
    result = run_msgbusd("--bogus")
    assert result.returncode == 2
    assert "Error: No such option: --bogus" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_phrase_is_one_line_and_does_not_echo_the_secret(twins_file: Path) -> None:
    secret = "these words are not a valid phrase at all"
    result = run_msgbusd("--twins", str(twins_file), env={"MSGBUS_MNEMONICS": secret})
    assert result.returncode == 1
    assert result.stderr.startswith("msgbusd: error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert secret not in result.stderr


def test_secret_file_must_not_be_readable_by_every_user(twins_file: Path, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SEED + "\n")
    secret_file.chmod(0o644)
    result = run_msgbusd("--twins", str(twins_file), "--mnemonics-file", str(secret_file))
    assert result.returncode == 2
    assert f"{secret_file} is readable by every user" in result.stderr
    assert SEED not in result.stderr

    secret_file.chmod(0o640)
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    result = run_msgbusd(
        "--twins", str(twins_file), "--mnemonics-file", str(secret_file), "--redis", redis_url
    )
    assert result.returncode == 1
    assert result.stderr.startswith("msgbusd: error: cannot connect to Redis"), "the secret was accepted"

    result = run_msgbusd(
        "--twins", str(twins_file), "--mnemonics-file", str(secret_file), env={"MSGBUS_MNEMONICS": SEED}
    )
    assert result.returncode == 2 and "give the secret once" in result.stderr


def test_unknown_key_type(twins_file: Path) -> None:
    result = run_msgbusd("--twins", str(twins_file), "--key-type", "rsa", env={"MSGBUS_MNEMONICS": SEED})
    assert result.returncode == 1
    assert "rsa" in result.stderr and "Traceback" not in result.stderr


def test_unreachable_redis(twins_file: Path) -> None:
    port = free_port()
    result = run_msgbusd(
        "--twins",
        str(twins_file),
        "--redis",
        f"redis://127.0.0.1:{port}/0",
        "--listen",
        f"127.0.0.1:{free_port()}",
        env={"MSGBUS_MNEMONICS": SEED},
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"msgbusd: error: cannot connect to Redis at redis://127.0.0.1:{port}/0")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen", "--router-listen", "--servicebus-listen"])
def test_port_in_use(twins_file: Path, redis_url: str, flag: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = {"--listen": f"127.0.0.1:{free_port()}", flag: f"127.0.0.1:{port}"}
        edge = ["--router-cloud", "5"] if flag == "--servicebus-listen" else []
        result = run_msgbusd(
            "--twins",
            str(twins_file),
            "--redis",
            redis_url,
            *[word for option, value in ports.items() for word in (option, value)],
            *edge,
            env={"MSGBUS_MNEMONICS": SEED},
        )
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"msgbusd: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mqtt", "mqtt://127.0.0.1:1883"], "--mqtt is for edge sites: give --router-cloud too"),
        (["--router-cloud", "cloud", "--mqtt", "127.0.0.1:1883"], "'127.0.0.1:1883' is not mqtt://HOST:PORT"),
        (["--router-listen", "9443"], "'9443' is not HOST:PORT"),
        (["--twin", "1", "--uplink", "1"], "--uplink 1 is this site's own twin"),
        (["--uplink", "2", "--no-links"], "--uplink needs links (drop --no-links)"),
        (["--relay", "--no-links"], "--relay needs links (drop --no-links)"),
        (
            ["--event-log-rotate-minutes", "1", "--event-log-rotate-seconds", "10"],
            "give --event-log-rotate-minutes or --event-log-rotate-seconds, not both",
        ),
    ],
)
def test_router_flags_are_checked(twins_file: Path, args: list[str], message: str) -> None:
    result = run_msgbusd("--twins", str(twins_file), *args, env={"MSGBUS_MNEMONICS": SEED})
    assert result.returncode == 2
    assert message in " ".join(result.stderr.replace("│", " ").split())
    assert "Traceback" not in result.stderr


def test_own_twin_is_found_from_the_key(twins_file: Path, redis_url: str, tmp_path: Path) -> None:
    site = SiteProcess(
        twin=5, redis_url=redis_url, twins_file=twins_file, mnemonic=SEED, log_path=tmp_path / "msgbusd.log"
    )
    site.command = lambda: [  # type: ignore[method-assign]
        sys.executable,
        "-m",
        "msgbusd",
        "--twins",
        str(twins_file),
        "--redis",
        redis_url,
        "--listen",
        f"127.0.0.1:{site.port}",
    ]
    site.start()
    try:
        assert "msgbusd ready: twin 5," in site.log()
    finally:
        site.stop()


def test_default_listen_address_is_dual_stack(twins_file: Path, redis_url: str, tmp_path: Path) -> None:
    site = SiteProcess(
        twin=5,
        redis_url=redis_url,
        twins_file=twins_file,
        mnemonic=SEED,
        listen_host="::",
        log_path=tmp_path / "msgbusd.log",
    )
    site.start()
    try:
        for url in (f"http://127.0.0.1:{site.port}/zbus-remote", f"http://[::1]:{site.port}/zbus-remote"):
            with httpx.Client(trust_env=False) as http:
                response = http.post(url, content=b"")
            assert response.status_code == 400
            assert response.json() == {"Status": "error", "Message": "couldn't parse json"}
    finally:
        site.stop()


def test_key_without_a_twin_is_a_clear_error(tmp_path: Path, redis_url: str) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [Twin(6, "127.0.0.1:1", bytes([6]) * 32)])
    result = run_msgbusd(
        "--twins",
        str(path),
        "--redis",
        redis_url,
        "--listen",
        f"127.0.0.1:{free_port()}",
        env={"MSGBUS_MNEMONICS": SEED},
    )
    assert result.returncode == 1
    assert "no twin found for account" in result.stderr and "pass --twin N" in result.stderr


def test_twin_source_problems_at_start_are_one_line(redis_url: str) -> None:
    env = {"MSGBUS_MNEMONICS": SEED}
    result = run_msgbusd("--twin", "1", "--redis", redis_url, "--substrate", "ftp://chain", env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("msgbusd: error: unsupported twin source URL 'ftp://chain'")
    assert result.stderr.count("\n") == 1
    # The public chain cannot be reached from the tests: a port nothing listens on stands for it.
    chain = f"ws://127.0.0.1:{free_port()}"
    result = run_msgbusd("--redis", redis_url, "--substrate", chain, "--twin-lookup-timeout", "2", env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("msgbusd: error: no twin found for this key (")
    assert chain in result.stderr and "pass --twin N" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.fixture
def one_site() -> Iterator[LocalCluster]:
    cluster = LocalCluster(size=1).start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_daemon_cleanly(one_site: LocalCluster, sig: signal.Signals) -> None:
    site = one_site.sites[0]
    assert site.process is not None
    site.process.send_signal(sig)
    assert site.process.wait(timeout=20) == 0
    assert "msgbusd stopped" in site.log()


@pytest.mark.parametrize("left_by", ["killed", "older release"])
def test_items_left_by_a_killed_daemon_are_taken_again_at_start(one_site: LocalCluster, left_by: str) -> None:
    site = one_site.sites[0]
    conn = redis.Redis.from_url(one_site.redis[0].url)
    assert site.process is not None
    killed = f"{socket.gethostname()}:{site.process.pid}"
    site.kill()
    # What a daemon killed mid-hand-off leaves behind: an item in its processing list (an older release
    # had one list for every process).
    ret = "c6a4a4b4-5d0e-4a0b-9a6b-8f5f2f6b7c11"
    request = Envelope(cmd="x", dst=(1,), ret=ret, ver=2)
    processing = (
        keys.instance_processing(keys.LOCAL, killed) if left_by == "killed" else keys.processing(keys.LOCAL)
    )
    conn.rpush(processing, request.encode())
    site.start()
    wait_until(lambda: conn.llen(ret) == 1, what="the recovered item to be handled")
    (answer,) = conn.lrange(ret, 0, -1)
    assert Envelope.decode(answer).err == "received invalid message: protocol version mismatch"
    assert conn.llen(processing) == 0
    if left_by == "killed":
        # Its process is gone: taken over at once, without waiting for its lease to run out.
        assert f"instance {killed} is dead" in site.log()
        assert conn.zscore(keys.INSTANCES, killed) is None
    else:
        assert "took back 1 unfinished item(s) of msgbus.system.local left by an older release" in site.log()
    conn.close()


def test_daemon_survives_a_redis_restart(one_site: LocalCluster) -> None:
    server = one_site.redis[0]
    server.kill()
    wait_until(lambda: ": redis failed (" in one_site.sites[0].log(), what="the daemon to notice")
    server.start()
    conn = redis.Redis.from_url(server.url)
    ret = "0f6a4f1e-8a39-4f8e-9a43-1d5a3a3b9c2e"
    conn.lpush(keys.LOCAL, Envelope(cmd="x", dst=(99,), ret=ret).encode())
    item = None
    deadline_s = 20.0
    started = time.monotonic()
    while item is None and time.monotonic() - started < deadline_s:
        item = conn.blpop([ret], timeout=0.5)
    assert item is not None, one_site.sites[0].log()
    assert Envelope.decode(item[1]).err == "all retries done: twin 99 not found"
    assert one_site.sites[0].process is not None and one_site.sites[0].process.poll() is None
    conn.close()
