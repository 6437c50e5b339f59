"""The benchmark's floor site (bench/floor_site.py) does what the wire asks of a site, so that its CPU per
request is a floor msgbusd can be measured against: every up twin's signed answer reaches its caller, and a
twin that cannot be reached, or is unknown, is answered with why."""

from __future__ import annotations

import pytest

from bench.scale import floor_site
from client.sync import Client
from testing.many_twins import ManyTwinsProcess

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]


def test_every_twin_gets_its_request_and_every_caller_its_answer() -> None:
    harness = ManyTwinsProcess(first=1000, count=30, down=3, links=False)
    twins = range(harness.first, harness.first + harness.count)
    with floor_site(harness) as (_pid, redis_url), Client(redis_url) as client:
        sent = {twin: client.send(twin, "floor.echo", f"to {twin}", exp=60, retries=0) for twin in twins}
        sent[5] = client.send(5, "floor.echo", "to nobody", exp=60, retries=0)
        answers = {twin: client.wait(ret, timeout=30)[0] for twin, ret in sent.items()}
        stats = harness.stats()

    for twin in harness.up_ids:
        answer = answers[twin]
        assert (answer.src, answer.error, answer.data) == (twin, "", f"to {twin}".encode())
    for twin in harness.down_twin_ids:
        assert "refused" in answers[twin].error, answers[twin]
    assert "twin 5 is not in the twin file" in answers[5].error
    assert stats["requests"]["post"] == len(harness.up_ids)
