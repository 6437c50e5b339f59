"""Recovery after faults, with the daemons' default retry settings (first re-send after 5 s, doubling to
60 s) and requests carrying ``try`` 8: two real sites, site 1 sending to a counting ``fault.echo`` on twin 2.

Each scenario asserts the promise (every request answered with its reply, once, executed once) and how soon
the bus catches up once the fault is over; the figures go to ``make faults`` (column "last answer after
recovery": from the moment the fault was over to the last answer).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from testing.local_sites import wait_until
from testing.site_metrics import metric
from tests.faults.harness import Report
from tests.faults.recovery import (
    RECEIVER,
    SENDER,
    RecoveryRun,
    RefusingPeer,
    Supervisor,
    broken_promises,
    kill_schedule,
    log_lines,
    record,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]

# Once the fault is over, the last answer must come within this.
RECOVERY_LIMIT_S = 10.0
# Bound on waiting for all outcomes once the fault is over, so that a daemon that fails does not hang.
OUTCOME_WAIT_S = 240.0


def assert_recovered(report: Report, problems: list[str], *, since: str) -> None:
    """Record the figures (``make faults``); fail with every problem at once, and the figures."""
    record(report)
    print(report.line())
    if report.recovery_s is None:
        problems.append(f"not every request had its outcome {OUTCOME_WAIT_S:.0f} s after {since}")
    elif report.recovery_s > RECOVERY_LIMIT_S:
        problems.append(
            f"the last answer came {report.recovery_s:.1f} s after {since} (limit {RECOVERY_LIMIT_S:.0f} s)"
        )
    assert not problems, "; ".join(problems) + "\n" + report.line()


# --- 1. the peer's daemon down for 40 s while 2,000 requests wait ------------------------------------

PEER_DOWN_REQUESTS = 2000
PEER_DOWN_S = 40.0


@pytest.mark.parametrize("hold_offline", [False, True], ids=["default", "hold-offline"])
def test_r1_peer_daemon_down_40s_while_2000_requests_wait(hold_offline: bool) -> None:
    mode = "--hold-offline" if hold_offline else "default"
    with RecoveryRun(daemon_args=("--hold-offline",) if hold_offline else ()) as run:
        receiver = run.sites[RECEIVER - 1]
        receiver.kill()  # its Redis and its service keep running
        died = time.monotonic()
        run.push(0, PEER_DOWN_REQUESTS, exp_s=600)
        threading.Event().wait(max(0.0, died + PEER_DOWN_S - time.monotonic()))  # the outage lasts 40 s
        untaken = run.local_queue_length()
        receiver.start()
        back = time.monotonic()
        run.wait_for_outcomes(PEER_DOWN_REQUESTS, OUTCOME_WAIT_S)
        report = run.audit(
            f"R1. peer msgbusd down 40 s, 2000 waiting ({mode})",
            PEER_DOWN_REQUESTS,
            started=died,
            recovered_at=back,
        )
    problems = broken_promises(report)
    if untaken:
        problems.append(f"site 1 had not taken {untaken} requests from its local queue after 40 s")
    assert_recovered(report, problems, since="site 2's daemon was ready again")


# --- 2. both daemons killed at random for 20 s while requests flow -----------------------------------

CHAOS_REQUESTS = 1500
CHAOS_PUSH_S = 15.0
CHAOS_S = 20.0
CHAOS_GAP_S = (0.4, 1.5)
CHAOS_SEED = 20260
READY_WAIT_S = 30.0


def test_r2_both_daemons_killed_at_random_for_20s() -> None:
    schedule = kill_schedule(random.Random(CHAOS_SEED), (SENDER, RECEIVER), CHAOS_S, CHAOS_GAP_S)
    with RecoveryRun() as run:
        supervisor = Supervisor(run.sites)
        pusher = threading.Thread(
            target=run.push_steadily, args=(CHAOS_REQUESTS, CHAOS_PUSH_S), kwargs={"exp_s": 90}, daemon=True
        )
        started = time.monotonic()
        pusher.start()
        supervisor.play(schedule)
        # Chaos is over once both daemons are ready again after the last kill.
        supervisor.wait_all_ready(READY_WAIT_S)
        chaos_end = time.monotonic()
        pusher.join()
        run.wait_for_outcomes(CHAOS_REQUESTS, OUTCOME_WAIT_S)
        report = run.audit(
            f"R2. both msgbusd killed (-9) {len(schedule)} times in 20 s",
            CHAOS_REQUESTS,
            started=started,
            recovered_at=chaos_end,
        )
        assert supervisor.last_kill is not None
        report.details["kills"] = ", ".join(f"twin {t}: {n}" for t, n in sorted(supervisor.kills.items()))
        report.details["ready_after_last_kill_s"] = round(chaos_end - supervisor.last_kill, 1)
        if run.last_arrival is not None:
            report.details["last_answer_after_last_kill_s"] = round(
                run.last_arrival - supervisor.last_kill, 1
            )
    problems = broken_promises(report)
    if supervisor.exited_by_themselves:
        problems.append(f"daemons that exited by themselves: {supervisor.exited_by_themselves}")
    assert_recovered(report, problems, since="both daemons were ready again after the last kill")


# --- 3. 5,000 re-sends due at once -------------------------------------------------------------------

BURST_REQUESTS = 5000
FIRST_ATTEMPTS_WAIT_S = 120.0
POOL_TROUBLE = ("Too many connections", "redis failed")


def test_r3_burst_of_5000_resends_due_at_once() -> None:
    """Twin 2's address first leads to a server that answers 500 (alive, refusing: not "peer down"), so
    every request fails its first attempt and gets its own backoff; once all 5,000 were refused, the
    address leads to site 2 itself, and the re-sends fall due together about 5 s after their first attempt.

    The first attempts take the sender a few seconds: ``first_attempts_spread_s`` in the figures. Re-sends
    that fell due before the last first attempt was refused were refused again (``refused_twice``) and come
    later; they are re-sends all the same."""
    with RefusingPeer() as refusing, RecoveryRun(twin_2_via=refusing.address) as run:
        assert run.proxy is not None
        started = time.monotonic()
        run.push(0, BURST_REQUESTS, exp_s=600)
        problems: list[str] = []
        try:
            wait_until(
                lambda: refusing.distinct_uids() >= BURST_REQUESTS,
                FIRST_ATTEMPTS_WAIT_S,
                f"{BURST_REQUESTS} first attempts refused",
            )
        except TimeoutError:
            problems.append(
                f"only {refusing.distinct_uids()} of {BURST_REQUESTS} requests were attempted "
                f"in {FIRST_ATTEMPTS_WAIT_S:.0f} s"
            )
        run.proxy.retarget(("127.0.0.1", run.sites[RECEIVER - 1].port))
        switched = time.monotonic()
        run.wait_for_outcomes(BURST_REQUESTS, OUTCOME_WAIT_S)
        report = run.audit(
            "R3. 5000 re-sends due at once", BURST_REQUESTS, started=started, recovered_at=switched
        )
        assert refusing.first_refusal is not None and refusing.last_first_refusal is not None
        report.details["first_attempts_spread_s"] = round(
            refusing.last_first_refusal - refusing.first_refusal, 1
        )
        report.details["refused_twice"] = refusing.refused_twice()
        trouble = {site.twin: log_lines(site, *POOL_TROUBLE) for site in run.sites}
        redis_errors = {site.twin: metric(site, "msgbus_errors_total", cause="redis") for site in run.sites}
        retried = metric(run.sites[SENDER - 1], "msgbus_messages_total", event="retried")
    report.details["retried"] = retried if retried is not None else "not exported"
    report.details["redis_errors"] = ", ".join(f"twin {t}: {n}" for t, n in redis_errors.items())
    report.details["pool_error_lines"] = ", ".join(f"twin {t}: {len(lines)}" for t, lines in trouble.items())
    record(report)
    print(report.line())
    problems += broken_promises(report)
    for twin, lines in trouble.items():
        if lines:
            shown = "\n  ".join(lines[:3])
            problems.append(f"twin {twin}'s daemon logged {len(lines)} Redis pool errors, e.g.:\n  {shown}")
    for twin, count in redis_errors.items():
        if count is None:
            problems.append(f'twin {twin} exports no msgbus_errors_total{{cause="redis"}}')
        elif count:
            problems.append(f'twin {twin}: msgbus_errors_total{{cause="redis"}} is {count:.0f}')
    if retried is None or retried < BURST_REQUESTS:
        problems.append(
            f'site 1: msgbus_messages_total{{event="retried"}} is {retried}, not >= {BURST_REQUESTS}'
        )
    assert not problems, "; ".join(problems) + "\n" + report.line()
