"""A relay's door (``--relay``), against a real Redis through the real app: what comes for a twin it relays is
kept for that twin, once, as its source signed it, and never handed to a service here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Set

import httpx
import pytest
import redis.asyncio as aioredis

from msgbusd.door.http_api import Door, create_app, dedup_ttl_s, seen_id
from msgbusd.door.relaying import Relaying
from msgbusd.identity.keys import load_signer
from msgbusd.identity.signing import Signer
from msgbusd.reports.metrics import Metrics
from msgbusd.sending.send_items import SendItem, SendItems
from msgbusd.store.queues import Store
from twin_resolver.base import Twin
from twin_resolver.static import StaticResolver
from wire import keys
from wire.envelope import Envelope

NOW = 1_700_000_000
RELAY, SOURCE, RELAYED, DIRECT = 1, 7, 9, 10


@pytest.fixture
def source() -> Signer:
    return load_signer("0x" + "22" * 32, "ed25519")


class Kicks:
    def __init__(self) -> None:
        self.items: dict[int, list[SendItem]] = {}
        self.alone: set[int] = set()

    def __call__(self, ready: Mapping[int, list[SendItem] | None], alone: Set[int]) -> None:
        for dst, items in ready.items():
            self.items.setdefault(dst, []).extend(items or [])
        self.alone |= alone


@pytest.fixture
def kicks() -> Kicks:
    return Kicks()


@pytest.fixture
async def http(async_redis: aioredis.Redis, source: Signer, kicks: Kicks) -> AsyncIterator[httpx.AsyncClient]:
    relay = load_signer("0x" + "11" * 32, "ed25519")
    resolver = StaticResolver.from_twins(
        [
            Twin(RELAY, "127.0.0.1:1", relay.public_key),
            Twin(SOURCE, "127.0.0.1:2", source.public_key),
            Twin(RELAYED, "", load_signer("0x" + "33" * 32, "ed25519").public_key, relay="127.0.0.1:1"),
            Twin(DIRECT, "127.0.0.1:4", load_signer("0x" + "44" * 32, "ed25519").public_key),
        ]
    )
    store = Store(async_redis)
    door = Door(store, resolver, relay, freshness_s=60, clock=lambda: NOW, twin=RELAY)
    door.relaying = Relaying(
        store,
        resolver,
        kicks,
        seen_id=seen_id,
        dedup_ttl_s=dedup_ttl_s,
        freshness_s=60,
        metrics=Metrics(),
        clock=lambda: NOW,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(door)), base_url="http://relay"
    ) as c:
        yield c


def message(signer: Signer, dst: int, uid: str = "9.1", dat: str = "c2VhbGVk") -> Envelope:
    env = Envelope(uid=uid, cmd="edge.echo", dat=dat, src=SOURCE, dst=(dst,), ret=keys.REPLY, now=NOW, exp=30)
    return signer.sign(env)


@pytest.mark.parametrize("path", ["/zbus-remote", "/zbus-reply"])
async def test_a_message_for_a_relayed_twin_is_kept_for_it_once_as_it_came(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, source: Signer, kicks: Kicks, path: str
) -> None:
    env = message(source, RELAYED)
    for _ in range(2):
        response = await http.post(path, content=env.encode())
        assert response.status_code == 200, response.text

    is_request = path == "/zbus-remote"
    key = keys.relayed_key(RELAYED, SOURCE, is_request, env.uid)
    assert await async_redis.lrange(keys.send_queue(RELAYED), 0, -1) == [("rep:" + key).encode()]
    assert Envelope.decode(await async_redis.hget(keys.REPLIES, key)) == env
    # Never for a service here, nor for the daemon's own queues.
    assert await async_redis.llen(keys.command_queue("edge.echo")) == 0
    assert await async_redis.llen(keys.REMOTE) == await async_redis.llen(keys.REPLY) == 0
    # Its sender is handed the item: sent on as it is, to the path it came on.
    (item,) = kicks.items[RELAYED]
    assert (item.relayed, item.path, item.envelope) == (True, path, env)
    assert kicks.alone == {RELAYED}
    # Sent on while the twin is away, it gives up at the end of its lifetime.
    items = await SendItems(Store(async_redis), RELAY).read(["rep:" + key])
    assert items[0].state == {"first": NOW, "attempts": 0, "deadline": NOW + 30}


async def test_a_message_for_a_twin_without_a_relay_is_refused(
    http: httpx.AsyncClient, source: Signer
) -> None:
    response = await http.post("/zbus-remote", content=message(source, DIRECT, uid="10.1").encode())
    assert response.status_code == 400
    assert response.json()["Message"].startswith("twin 10 is not reached through a relay")
    missing = await http.post("/zbus-remote", content=message(source, 99, uid="99.1").encode())
    assert (missing.status_code, missing.json()["Message"]) == (400, "destination twin 99 not found")


async def test_a_forged_message_is_refused_before_it_is_kept(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, source: Signer
) -> None:
    forged = message(source, RELAYED).replace(dat="Y2hhbmdlZA==")
    response = await http.post("/zbus-remote", content=forged.encode())
    assert (response.status_code, response.json()["Message"]) == (400, "couldn't verify signature")
    assert await async_redis.llen(keys.send_queue(RELAYED)) == 0
