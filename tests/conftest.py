from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from xdist.remote import Producer

from testing.local_sites import RedisProcess
from tests.scheduling import LongestFirst, longest_first

TESTS = Path(__file__).parent

# The JVMs the tests start (Spark's, in this process or in a job of their own) keep their scratch files (the
# block manager's, the artifacts') in a directory of this run's, removed when it ends: Spark removes its own
# only from a JVM that ends by itself; a job killed, or a session's JVM ended with its Python, leaves them.
JVM_TMP = tempfile.mkdtemp(prefix="msgbus-tests-jvm-")
JVM_OPTIONS = os.environ.get("JAVA_TOOL_OPTIONS", "")
os.environ["JAVA_TOOL_OPTIONS"] = f"{JVM_OPTIONS} -Djava.io.tmpdir={JVM_TMP}".strip()
atexit.register(shutil.rmtree, JVM_TMP, ignore_errors=True)

# Tests that start msgbusd, mosquitto, a JVM or a redis-server of their own; the rest (the unit tier of
# `make test-fast`) share one redis-server and start nothing else that lives on.
PROCESS_DIRS = {"spark", "faults"}
PROCESS_MODULES = {
    "door/test_fuzz_door.py",
    "gateway/test_gateway.py",
    "netbed/test_bed.py",
    "reports/test_event_log_full_disk.py",
    "reports/test_event_log_sites.py",
    "router/test_e2e.py",
    "router/test_faults.py",
    "router/test_mqtt_bridge.py",
    "link/test_links.py",
    "site/test_daemon_cli.py",
    "site/test_load_balancer.py",
    "site/test_many_edges.py",
    "site/test_processes.py",
    "site/test_redis_auth_tls.py",
    "site/test_redis_memory_sites.py",
    "site/test_clock_skew.py",
    "site/test_two_sites.py",
    "store/test_replication.py",
    "test_sentinel_clients.py",
    "test_client_order.py",
    "test_client_redis_full.py",
    "test_client_taken.py",
    "test_demo.py",
    "test_monitoring_site.py",
    "test_status_sites.py",
    "test_twin_sources_sites.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = sorted(module for module in PROCESS_MODULES if not (TESTS / module).is_file())
    if missing:
        raise pytest.UsageError(f"PROCESS_MODULES names test modules that are not there: {missing}")
    for item in items:
        where = item.path.relative_to(TESTS)
        if where.parts[0] in PROCESS_DIRS or where.as_posix() in PROCESS_MODULES:
            item.add_marker(pytest.mark.processes)
    longest_first(items, TESTS)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LongestFirst | None:
    return LongestFirst(config, log) if config.getoption("dist") == "loadscope" else None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One redis-server for the whole run; each test gets it flushed (see ``redis_url``)."""
    server = RedisProcess().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    with redis.Redis.from_url(redis_server.url) as conn:
        conn.flushall()
    return redis_server.url


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
async def async_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    conn = aioredis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        await conn.aclose()
