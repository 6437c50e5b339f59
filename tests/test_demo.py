"""``msgbus demo`` end to end, as a newcomer runs it: what it shows, and that it leaves nothing running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testing.local_sites import port_open

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

DEMO = [sys.executable, "-c", "from client.cli import main; main()", "demo"]


def ports_in(output: str) -> list[int]:
    return [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", output)]


def test_demo_shows_every_flow_and_cleans_up() -> None:
    result = subprocess.run(DEMO, capture_output=True, text=True, timeout=80)
    out = result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"twin 2 -> 'HELLO MSGBUS' \(uid 2\.\d+\)", out)
    assert re.search(r"twin 1 -> 'FAN OUT'", out) and re.search(r"twin 2 -> 'FAN OUT'", out)
    assert "twin 99 -> error: all retries done: twin 99 not found" in out
    assert '"dat": "PROXY CALL", "err": ""' in out
    twin_map = re.search(r"twin map: (\S+)", out)
    assert twin_map is not None
    assert not Path(twin_map.group(1)).exists()
    ports = ports_in(out)
    assert len(ports) == 4
    assert not any(port_open(port) for port in ports)


def as_from_a_terminal() -> None:
    """Ctrl-C as a shell leaves it to a command it starts: handled by default, not blocked (whatever the
    test's worker inherited or set for itself)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def signal_state(pid: int) -> str:
    """The signals process ``pid`` blocks and ignores (/proc/PID/status)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigPnd", "ShdPnd")))


def test_ctrl_c_stops_everything_the_demo_started() -> None:
    # With --keep, the sites serve on after the demo: Ctrl-C comes while they do, however slow the machine.
    # A session of its own: should Ctrl-C fail, the demo and the sites it started are killed together.
    process = subprocess.Popen(
        [*DEMO, "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
        start_new_session=True,
    )
    assert process.stdout is not None
    seen = ""
    while "stay up until Ctrl-C" not in seen:
        line = process.stdout.readline()
        assert line, f"demo ended early: {seen}"
        seen += line
    process.send_signal(signal.SIGINT)
    try:
        rest, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        state = signal_state(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        rest, err = process.communicate()
        raise AssertionError(f"the demo went on after Ctrl-C ({state}): {seen}{rest}{err}") from None
    assert process.returncode == 130, seen + rest + err
    assert "interrupted" in err
    ports = ports_in(seen)
    assert len(ports) == 4
    assert not any(port_open(port) for port in ports)
