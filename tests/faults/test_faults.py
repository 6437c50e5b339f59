"""The six fault scenarios: thousands of requests through real sites while daemons, links, Redis and a
service fail. Each asserts the bus's promise: exactly one final outcome per destination, none lost, none
executed twice. The figures of the last run are in docs/reliability.md (``make faults`` rewrites them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testing.local_sites import wait_until
from tests.faults.harness import RECEIVERS, TRIES, FaultRun, Report, serving

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(400)]

REQUESTS = 2500
EXPECTED = REQUESTS * len(RECEIVERS)
OUTAGE_S = 20.0


def assert_promise_kept(report: Report, *, all_ok: bool) -> None:
    print(report.line())
    assert report.lost == 0, report.line()
    assert report.duplicate_outcomes == 0, report.line()
    assert report.executed_twice == 0, report.line()
    assert report.outcomes == EXPECTED, report.line()
    if all_ok:
        assert report.ok == EXPECTED, report.line()


def at_progress(run: FaultRun, share: float) -> None:
    """Wait until ``share`` of all outcomes have arrived."""
    wait_until(lambda: run.outcome_count() >= share * EXPECTED, 180, f"{share:.0%} of the outcomes")


@contextmanager
def fault_run(
    daemon_args: tuple[str, ...] = (), redis_appendonly: bool = False, retries: int = TRIES
) -> Iterator[FaultRun]:
    run = FaultRun(daemon_args=daemon_args, redis_appendonly=redis_appendonly, retries=retries)
    try:
        yield run
    finally:
        run.close()


@pytest.fixture
def plain_run() -> Iterator[FaultRun]:
    with fault_run() as run:
        yield run


def test_1_sender_daemon_killed_repeatedly(plain_run: FaultRun) -> None:
    sender = plain_run.cluster.sites[0]

    def kill_sender(run: FaultRun) -> None:
        for share in (0.15, 0.35, 0.55):
            at_progress(run, share)
            sender.kill()
            sender.start()

    with serving(plain_run) as executions:
        report = plain_run.run("1. sender msgbusd killed (-9) 3 times", REQUESTS, executions, kill_sender)
    assert_promise_kept(report, all_ok=True)


def test_2_receiver_daemon_killed_repeatedly(plain_run: FaultRun) -> None:
    receiver = plain_run.cluster.sites[1]

    def kill_receiver(run: FaultRun) -> None:
        for share in (0.15, 0.35, 0.55):
            at_progress(run, share)
            receiver.kill()
            receiver.start()

    with serving(plain_run) as executions:
        report = plain_run.run("2. receiver msgbusd killed (-9) 3 times", REQUESTS, executions, kill_receiver)
    assert_promise_kept(report, all_ok=True)


# Requests keep coming for 10 s (100 every 0.4 s), so that many are pushed while twin 2 is cut off.
SLOW_PUSH_S = 0.4


def cut_twin_2(run: FaultRun) -> None:
    at_progress(run, 0.1)
    run.proxies[2].cut()
    threading.Event().wait(OUTAGE_S)  # the outage lasts this long, whatever happens meanwhile
    run.proxies[2].restore()


def test_3a_receiver_unreachable_for_20s() -> None:
    # try=3: a request's tries last about a second here, far less than the outage.
    with fault_run(retries=3) as run, serving(run) as executions:
        report = run.run(
            "3a. receiver unreachable 20 s (try 3)",
            REQUESTS,
            executions,
            cut_twin_2,
            push_pause_s=SLOW_PUSH_S,
        )
    # Without --hold-offline, requests to the absent twin spend their tries and fail: one error each.
    assert_promise_kept(report, all_ok=False)
    assert set(report.errors) == {"all retries done"}
    assert report.errors["all retries done"] >= 100, "requests pushed during the outage fail"


def test_3b_receiver_unreachable_for_20s_with_hold_offline() -> None:
    with fault_run(daemon_args=("--hold-offline",)) as run:
        with serving(run) as executions:
            report = run.run(
                "3b. receiver unreachable 20 s, --hold-offline",
                REQUESTS,
                executions,
                cut_twin_2,
                push_pause_s=SLOW_PUSH_S,
            )
        assert_promise_kept(report, all_ok=True)
        assert "holding messages to twin 2" in run.cluster.sites[0].log()


def test_4_answers_lost_after_the_request_arrived(plain_run: FaultRun) -> None:
    def lose_answers(run: FaultRun) -> None:
        for twin in RECEIVERS:
            run.proxies[twin].drop_answers = 0.15

    with serving(plain_run) as executions:
        report = plain_run.run("4. 15 % of HTTP answers dropped", REQUESTS, executions, lose_answers)
    # Between msgbus sites one answer covers a batch of up to 64 messages: each drop re-sends them all.
    assert sum(proxy.dropped_answers for proxy in plain_run.proxies.values()) >= 3
    assert_promise_kept(report, all_ok=True)


def test_5_sender_redis_restarted() -> None:
    with fault_run(redis_appendonly=True) as run:

        def restart_redis(run: FaultRun) -> None:
            for share in (0.2, 0.5):
                at_progress(run, share)
                run.cluster.redis[0].stop()
                run.cluster.redis[0].start()

        with serving(run) as executions:
            report = run.run("5. sender's Redis restarted twice (AOF)", REQUESTS, executions, restart_redis)
        assert_promise_kept(report, all_ok=True)


def test_6_service_crashes_mid_request(plain_run: FaultRun) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="msgbus-crash-"))
    try:
        service_crashes_mid_request(plain_run, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def service_crashes_mid_request(plain_run: FaultRun, workdir: Path) -> None:
    log_file = workdir / "executions.log"
    crash_at = str(REQUESTS // 2)
    command = [
        sys.executable,
        "-m",
        "tests.faults.crashing_service",
        plain_run.cluster.redis[1].url,
        str(log_file),
        crash_at,
        str(workdir / "crashed"),
    ]
    processes = [subprocess.Popen(command, stderr=subprocess.DEVNULL)]
    stop = threading.Event()

    def supervise() -> None:
        # What systemd's Restart=on-failure does for a real service.
        while not stop.wait(0.05):
            if processes[-1].poll() is not None:
                processes.append(subprocess.Popen(command, stderr=subprocess.DEVNULL))

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    try:
        with serving(plain_run, twins=(3,)) as site3_executions:

            def executions() -> dict[int, Counter[bytes]]:
                counted = site3_executions()
                counted[2] = Counter(line.encode() for line in log_file.read_text().split())
                return counted

            report = plain_run.run("6. service crashes mid-request once", REQUESTS, executions)
    finally:
        stop.set()
        supervisor.join()
        for process in processes:
            process.kill()
            process.wait()
    assert len(processes) == 2, "the service crashed once and was restarted"
    assert_promise_kept(report, all_ok=True)
    assert Counter(log_file.read_text().split())[crash_at] == 1
