"""The client library's requests reach services in the order they were sent, through a real msgbusd."""

from __future__ import annotations

import asyncio

import pytest

from client import AsyncClient, Client
from testing.local_sites import LocalCluster
from tests.support.services import RawService
from wire import keys
from wire.envelope import Envelope

pytestmark = pytest.mark.timeout(60)

SITE = 1
CMD = "echo.order"


async def send_async(redis_url: str, payloads: list[str]) -> list[str]:
    async with AsyncClient(redis_url) as client:
        return [await client.send(SITE, CMD, payload) for payload in payloads]


def test_a_backlog_of_requests_is_served_in_push_order() -> None:
    payloads = [str(n) for n in range(20)]
    cluster = LocalCluster(size=1).prepare()
    try:
        url = cluster.redis[0].url
        with Client(url) as client:
            # Sent while no daemon runs, so they wait in msgbus.system.local together.
            rets = [client.send(SITE, CMD, payload) for payload in payloads[:10]]
            rets += asyncio.run(send_async(url, payloads[10:]))
            queued = [Envelope.decode(raw).payload for raw in client.redis.lrange(keys.LOCAL, 0, -1)]
            assert queued == [payload.encode() for payload in payloads]

            cluster.launch()
            with RawService(url, CMD) as service:
                replies = [client.wait(ret, timeout=20)[0].data for ret in rets]
    finally:
        cluster.cleanup()
    assert [request.payload for request in service.requests] == [payload.encode() for payload in payloads]
    assert replies == [payload.encode() for payload in payloads]
