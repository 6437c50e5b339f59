"""``msgbus status`` on a Redis that may evict keys or that is full: the problems, the table's Redis line and
the JSON, from views; then read from the suite's redis-server (its policy and maxmemory set back after each
test)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis

from client.status import gather
from client.status_check import DEGRADED, HEALTHY, assess
from client.status_render import render_json, render_table
from tests.support.servers import free_port
from tests.test_status_render import daemon_view, redis_view, site

URL = "redis://127.0.0.1:6379/0"
EVICTING = (
    f"Redis at {URL} has maxmemory-policy allkeys-lru: under memory pressure it may drop queued messages; "
    "set maxmemory-policy noeviction (redis.conf or CONFIG SET)"
)
FULL = (
    "Redis is full (1.00M used, maxmemory 1.00M): it refuses new messages (local requests, messages from "
    "other sites, replies) until memory is freed or maxmemory is raised"
)
LIMIT = {"maxmemory": 1_048_576, "maxmemory_human": "1.00M"}


def redis_line(table: str) -> str:
    (line,) = [line for line in table.splitlines() if line.startswith("  redis ")]
    return line


@pytest.mark.parametrize("policy", ["noeviction", ""])
def test_noeviction_or_a_redis_that_does_not_say_is_no_problem(policy: str) -> None:
    roomy = redis_view(maxmemory_policy=policy, maxmemory=100 << 20, maxmemory_human="100.00M")
    status = site(roomy, daemon_view())
    verdict = assess(status)
    assert verdict.exit_code == HEALTHY
    assert "maxmemory-policy" not in redis_line(render_table(status, verdict, colour=False))


def test_an_evicting_policy_makes_the_site_degraded_and_is_named() -> None:
    status = site(redis_view(maxmemory_policy="allkeys-lru"), daemon_view())
    verdict = assess(status)
    assert (verdict.exit_code, verdict.problems) == (DEGRADED, (EVICTING,))
    table = render_table(status, verdict, colour=False)
    assert redis_line(table).endswith("answering; 1.43M used, no maxmemory, maxmemory-policy allkeys-lru")
    redis_part = json.loads(render_json(status, verdict))["redis"]
    assert (redis_part["maxmemory_policy"], redis_part["evicting"], redis_part["full"]) == (
        "allkeys-lru",
        True,
        False,
    )


def test_the_daemons_warning_of_the_same_policy_is_listed_once() -> None:
    status = site(redis_view(maxmemory_policy="allkeys-lru"), daemon_view(warnings=(EVICTING,)))
    assert assess(status).problems == (EVICTING,)


def test_the_policy_read_here_wins_over_the_daemons_older_word() -> None:
    fixed = site(redis_view(maxmemory_policy="noeviction"), daemon_view(warnings=(EVICTING,)))
    assert assess(fixed).exit_code == HEALTHY
    changed = site(redis_view(maxmemory_policy="volatile-lru"), daemon_view(warnings=(EVICTING,)))
    assert assess(changed).problems == (EVICTING.replace("allkeys-lru", "volatile-lru"),)
    # Without Redis, the daemon's word is all there is.
    unread = site(None, daemon_view(warnings=(EVICTING,)), redis_error="Connection refused")
    assert EVICTING in assess(unread).problems


@pytest.mark.parametrize("used", [1_048_576, 1_200_000])
def test_a_redis_at_or_over_its_maxmemory_is_full_and_says_what_it_refuses(used: int) -> None:
    status = site(
        redis_view(used_memory=used, used_memory_human="1.00M", maxmemory_policy="noeviction", **LIMIT),
        daemon_view(),
    )
    verdict = assess(status)
    assert (verdict.exit_code, verdict.problems) == (DEGRADED, (FULL,))
    table = render_table(status, verdict, colour=False)
    assert redis_line(table).endswith("answering; 1.00M used, maxmemory 1.00M (FULL)")
    assert FULL in table
    redis_part = json.loads(render_json(status, verdict))["redis"]
    assert (redis_part["full"], redis_part["evicting"]) == (True, False)


def test_a_redis_just_under_its_maxmemory_is_near_the_limit_not_full() -> None:
    status = site(redis_view(used_memory=1_000_000, **LIMIT), daemon_view())
    assert assess(status).problems == ("Redis uses 95% of its maxmemory: at the limit it refuses writes",)


def test_a_full_redis_that_evicts_says_so_and_comes_first() -> None:
    status = site(
        redis_view(used_memory=1_048_576, used_memory_human="1.00M", maxmemory_policy="allkeys-lru", **LIMIT),
        daemon_view(problems=("loop msgbus.system.local has not run for 20s",)),
    )
    assert assess(status).problems == (
        "Redis is full (1.00M used, maxmemory 1.00M): it evicts keys to make room, queued messages "
        "among them",
        EVICTING,
        "the daemon reports: loop msgbus.system.local has not run for 20s",
    )


@pytest.fixture
def config(sync_redis: redis.Redis) -> Iterator[Callable[[str, object], None]]:
    def set_to(name: str, value: object) -> None:
        sync_redis.config_set(name, value)  # type: ignore[arg-type]

    try:
        yield set_to
    finally:
        set_to("maxmemory", 0)
        set_to("maxmemory-policy", "noeviction")


def test_the_policy_is_read_from_redis(redis_url: str, config: Callable[[str, object], None]) -> None:
    site_url = f"http://127.0.0.1:{free_port()}"
    assert (view := gather(redis_url, site_url, timeout_s=2).redis) is not None
    assert (view.maxmemory_policy, view.evicting) == ("noeviction", False)

    config("maxmemory-policy", "volatile-ttl")

    status = gather(redis_url, site_url, timeout_s=2)
    assert status.redis is not None and status.redis.maxmemory_policy == "volatile-ttl"
    assert EVICTING.replace(URL, redis_url).replace("allkeys-lru", "volatile-ttl") in assess(status).problems


def test_a_redis_whose_maxmemory_is_reached_is_read_as_full(
    redis_url: str, config: Callable[[str, object], None]
) -> None:
    config("maxmemory", 1)
    status = gather(redis_url, f"http://127.0.0.1:{free_port()}", timeout_s=2)
    assert status.redis is not None and status.redis.full
    (full,) = [problem for problem in assess(status).problems if problem.startswith("Redis is full")]
    assert f"used, maxmemory {status.redis.maxmemory_human}): it refuses new messages" in full
