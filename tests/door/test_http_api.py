"""Every answer of the site's HTTP door, against a real Redis, through the real starlette app."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from msgbusd.door.http_api import Door, create_app
from msgbusd.door.rate_limit import TokenBuckets
from msgbusd.identity.keys import load_signer
from msgbusd.identity.signing import Signer, verify
from msgbusd.reports.event_log import EventLog
from msgbusd.reports.metrics import Metrics
from msgbusd.store.queues import Store
from testing.local_sites import free_port
from tests.support.events import read_events
from twin_resolver.base import ResolverUnavailable, Twin
from twin_resolver.static import StaticResolver
from wire import keys
from wire.envelope import Envelope

PHRASE = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
NOW = 1_700_000_000
SITE_TWIN = 1
ED_TWIN = 7
SR_TWIN = 8
SERVICE_QUEUE = keys.command_queue("zos.statistics.get")


class FixedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class UnreachableChain:
    """Stands in for a chain endpoint that times out: the public TFChain cannot be reached from the tests."""

    async def get_twin(self, twin_id: int) -> Twin:
        raise ResolverUnavailable("i/o timeout")

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        raise ResolverUnavailable("i/o timeout")

    async def aclose(self) -> None:
        return None


@pytest.fixture
def site_signer() -> Signer:
    return load_signer("0x" + "11" * 32, "ed25519")


@pytest.fixture
def ed_signer() -> Signer:
    return load_signer(PHRASE, "ed25519")


@pytest.fixture
def sr_signer() -> Signer:
    return load_signer(PHRASE, "sr25519")


@pytest.fixture
def resolver(site_signer: Signer, ed_signer: Signer, sr_signer: Signer) -> StaticResolver:
    return StaticResolver.from_twins(
        [
            Twin(SITE_TWIN, "127.0.0.1:1", site_signer.public_key),
            Twin(ED_TWIN, "127.0.0.1:2", ed_signer.public_key),
            Twin(SR_TWIN, "127.0.0.1:3", sr_signer.public_key),
        ]
    )


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
async def http(
    async_redis: aioredis.Redis, resolver: StaticResolver, site_signer: Signer, clock: FixedClock
) -> AsyncIterator[httpx.AsyncClient]:
    door = Door(Store(async_redis), resolver, site_signer, freshness_s=60, clock=clock)
    transport = httpx.ASGITransport(app=create_app(door))
    async with httpx.AsyncClient(transport=transport, base_url="http://site") as client:
        yield client


def request_from(signer: Signer, src: int, **fields: object) -> Envelope:
    env = Envelope(
        uid=f"{SITE_TWIN}.1",
        cmd="zos.statistics.get",
        dat="e30=",
        src=src,
        dst=(SITE_TWIN,),
        ret="msgbus.system.reply",
        now=NOW,
    ).replace(**fields)
    return signer.sign(env)


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert list(body) == ["Status", "Message"]
    assert body["Status"] == "error"
    assert response.headers["content-type"] == "application/json"
    return str(body["Message"])


@pytest.mark.parametrize("path", ["/zbus-remote", "/zbus-reply"])
async def test_signed_message_is_accepted_and_queued(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer, path: str
) -> None:
    env = request_from(ed_signer, ED_TWIN)
    response = await http.post(path, content=env.encode())
    assert response.status_code == 200
    assert response.content == b'{"status": "accepted"}'
    # A valid request goes straight to its service's list; a reply (not for this door's twin) to the loop.
    queue = SERVICE_QUEUE if path == "/zbus-remote" else keys.REPLY
    queued = await async_redis.lrange(queue, 0, -1)
    assert [Envelope.decode(item) for item in queued] == [env]


async def test_a_resent_request_is_accepted_but_queued_once(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer, clock: FixedClock
) -> None:
    first = request_from(ed_signer, ED_TWIN, uid="1.5")
    clock.now += 3
    again = request_from(ed_signer, ED_TWIN, uid="1.5", now=NOW + 3)
    assert first.sig != again.sig
    for env in (first, again):
        response = await http.post("/zbus-remote", content=env.encode())
        assert response.status_code == 200
        assert response.content == b'{"status": "accepted"}'
    assert await async_redis.llen(SERVICE_QUEUE) == 1


async def test_the_same_uid_with_other_content_or_from_another_twin_is_a_new_request(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer, sr_signer: Signer
) -> None:
    for env in (
        request_from(ed_signer, ED_TWIN, uid="1.6"),
        request_from(ed_signer, ED_TWIN, uid="1.6", dat="e31="),
        request_from(sr_signer, SR_TWIN, uid="1.6"),
    ):
        assert (await http.post("/zbus-remote", content=env.encode())).status_code == 200
    assert await async_redis.llen(SERVICE_QUEUE) == 3


async def test_the_duplicate_marker_lives_as_long_as_the_request(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer
) -> None:
    await http.post("/zbus-remote", content=request_from(ed_signer, ED_TWIN, uid="1.7", exp=30).encode())
    (marker,) = await async_redis.keys(keys.seen(ED_TWIN, "1.7.*"))
    assert 30 < await async_redis.ttl(marker) <= 30 + 60


async def test_an_invalid_request_goes_to_the_daemon_loop_which_answers_it(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer
) -> None:
    env = request_from(ed_signer, ED_TWIN, cmd="")
    assert (await http.post("/zbus-remote", content=env.encode())).status_code == 200
    assert [Envelope.decode(item) for item in await async_redis.lrange(keys.REMOTE, 0, -1)] == [env]
    assert await async_redis.llen(SERVICE_QUEUE) == 0


async def test_sr25519_signatures_are_accepted(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, sr_signer: Signer
) -> None:
    response = await http.post("/zbus-remote", content=request_from(sr_signer, SR_TWIN).encode())
    assert response.status_code == 200
    assert await async_redis.llen(SERVICE_QUEUE) == 1


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "FETCH"])
async def test_any_method_and_content_type_is_accepted(
    http: httpx.AsyncClient, ed_signer: Signer, method: str
) -> None:
    response = await http.request(
        method,
        "/zbus-remote",
        content=request_from(ed_signer, ED_TWIN).encode(),
        headers={"content-type": "text/plain"},
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"src":"7"}', b'{"dst":{}}'])
async def test_unparsable_body_is_refused(http: httpx.AsyncClient, body: bytes) -> None:
    response = await http.post("/zbus-remote", content=body)
    assert response.status_code == 400
    assert error_of(response) == "couldn't parse json"


async def test_old_message_is_refused_with_its_age(http: httpx.AsyncClient, ed_signer: Signer) -> None:
    env = request_from(ed_signer, ED_TWIN, now=NOW - 100)
    response = await http.post("/zbus-remote", content=env.encode())
    assert response.status_code == 400
    assert error_of(response) == (f"message is too old, sent since 1m40s, sent time: {NOW - 100}, now: {NOW}")


async def test_message_at_the_freshness_limit_is_accepted(http: httpx.AsyncClient, ed_signer: Signer) -> None:
    response = await http.post("/zbus-reply", content=request_from(ed_signer, ED_TWIN, now=NOW - 60).encode())
    assert response.status_code == 200


async def test_message_without_now_is_too_old(http: httpx.AsyncClient) -> None:
    response = await http.post("/zbus-remote", content=b'{"ver":1,"src":7}')
    assert response.status_code == 400
    assert error_of(response).startswith("message is too old, sent since ")
    assert error_of(response).endswith(f", sent time: 0, now: {NOW}")


async def test_unknown_source_twin(http: httpx.AsyncClient, ed_signer: Signer) -> None:
    response = await http.post("/zbus-remote", content=request_from(ed_signer, 99).encode())
    assert response.status_code == 400
    assert error_of(response) == "source twin 99 not found"


async def test_resolver_failure_is_a_502(
    async_redis: aioredis.Redis, site_signer: Signer, ed_signer: Signer, clock: FixedClock
) -> None:
    door = Door(Store(async_redis), UnreachableChain(), site_signer, clock=clock)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(door)), base_url="http://s"
    ) as http:
        response = await http.post("/zbus-cmd", content=request_from(ed_signer, ED_TWIN).encode())
    assert response.status_code == 502
    assert error_of(response) == "couldn't get twin 7 public key: i/o timeout"


@pytest.mark.parametrize(
    ("sig", "message"),
    [
        ("", "signature field is empty, visit the project github repo for instructions to update"),
        ("zz" * 65, "couldn't decode signature: encoding/hex: invalid byte: U+007A 'z'"),
        ("65" + "00" * 63 + "0", "couldn't decode signature: encoding/hex: odd length hex string"),
        ("78" + "00" * 64, "unrecognized signature prefix 78"),
        ("65" + "00" * 10, "couldn't verify signature"),
        ("65" + "00" * 64, "couldn't verify signature"),
    ],
)
async def test_bad_signatures(http: httpx.AsyncClient, ed_signer: Signer, sig: str, message: str) -> None:
    env = request_from(ed_signer, ED_TWIN).replace(sig=sig)
    response = await http.post("/zbus-remote", content=env.encode())
    assert response.status_code == 400
    assert error_of(response) == message


async def test_tampered_message_fails_verification(http: httpx.AsyncClient, ed_signer: Signer) -> None:
    env = request_from(ed_signer, ED_TWIN).replace(dat="e31=")
    response = await http.post("/zbus-reply", content=env.encode())
    assert response.status_code == 400
    assert error_of(response) == "couldn't verify signature"


async def test_signature_of_another_twin_fails(http: httpx.AsyncClient, sr_signer: Signer) -> None:
    response = await http.post("/zbus-remote", content=request_from(sr_signer, ED_TWIN).encode())
    assert response.status_code == 400
    assert error_of(response) == "couldn't verify signature"


async def test_checks_run_in_contract_order(http: httpx.AsyncClient) -> None:
    # Old, unknown twin and unsigned at once: freshness is reported first.
    stale = Envelope(src=99, now=NOW - 1000)
    assert error_of(await http.post("/zbus-remote", content=stale.encode())).startswith("message is too old")
    unknown = Envelope(src=99, now=NOW)
    assert error_of(await http.post("/zbus-remote", content=unknown.encode())) == "source twin 99 not found"


async def test_zbus_cmd_queues_a_proxy_request_and_returns_its_queue(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, sr_signer: Signer
) -> None:
    env = request_from(sr_signer, SR_TWIN, pxy=True, ret="", uid="")
    response = await http.post("/zbus-cmd", content=env.encode())
    assert response.status_code == 200
    retqueue = response.json()["retqueue"]
    assert uuid.UUID(retqueue).version == 4
    (queued,) = await async_redis.lrange(keys.REMOTE, 0, -1)
    assert Envelope.decode(queued) == env.replace(pxy=True, ret=retqueue)


async def test_zbus_result_lists_items_decoded_and_signed_by_the_site_without_removing_them(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, site_signer: Signer
) -> None:
    retqueue = str(uuid.uuid4())
    reply = Envelope(
        uid="1.1", cmd="c", dat="eyJhIjoxfQ==", src=SITE_TWIN, dst=(SR_TWIN,), ret=retqueue, pxy=True
    )
    await async_redis.lpush(retqueue, reply.encode())
    body = json.dumps({"retqueue": retqueue})
    first = await http.post("/zbus-result", content=body)
    second = await http.post("/zbus-result", content=body)
    assert first.status_code == 200 and second.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert first.json() == second.json()
    (item,) = first.json()
    shown = Envelope.from_wire(item)
    assert shown.dat == '{"a":1}'
    assert shown.now == NOW
    verify(shown, site_signer.public_key)
    assert await async_redis.llen(retqueue) == 1


async def test_zbus_result_of_an_empty_queue_is_an_empty_list(http: httpx.AsyncClient) -> None:
    response = await http.post("/zbus-result", content=json.dumps({"retqueue": str(uuid.uuid4())}))
    assert response.status_code == 200
    assert response.json() == []


# go-rmb wants a version-4 UUID.
VERSION_1_UUID = uuid.NAMESPACE_DNS


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "couldn't parse json"),
        (b"{}", "couldn't parse json"),
        (b'{"retqueue": 5}', "couldn't parse json"),
        (b'{"retqueue": "msgbus.system.reply"}', "Invalid Retqueue, it should be a valid UUID"),
        # Fixed, so that every test worker collects the same test.
        (
            json.dumps({"retqueue": str(VERSION_1_UUID)}).encode(),
            "Invalid Retqueue, it should be a valid UUID",
        ),
    ],
)
async def test_zbus_result_refusals(http: httpx.AsyncClient, body: bytes, message: str) -> None:
    response = await http.post("/zbus-result", content=body)
    assert response.status_code == 400
    assert error_of(response) == message


async def test_unknown_path_is_not_found(http: httpx.AsyncClient) -> None:
    assert (await http.post("/zbus-nothing", content=b"{}")).status_code == 404


async def test_operations_endpoints_refuse_other_machines(
    async_redis: aioredis.Redis, site_signer: Signer
) -> None:
    from starlette.routing import Route

    from msgbusd.door.http_api import loopback_only
    from msgbusd.reports.metrics import Metrics, metrics_endpoint

    door = Door(Store(async_redis), StaticResolver.from_twins([]), site_signer)
    app = create_app(door, [Route("/metrics", loopback_only(metrics_endpoint(Metrics())))])
    for client, status in (
        (("10.1.2.3", 5000), 403),
        (("::ffff:127.0.0.1", 5000), 200),
        (("::1", 5000), 200),
    ):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://site") as http:
            assert (await http.get("/metrics")).status_code == status


async def test_a_batch_is_answered_message_by_message(
    http: httpx.AsyncClient, async_redis: aioredis.Redis, ed_signer: Signer
) -> None:
    good = request_from(ed_signer, ED_TWIN, uid="1.10")
    forged = request_from(ed_signer, ED_TWIN, uid="1.11").replace(dat="e31=")
    reply = request_from(ed_signer, ED_TWIN, uid="7.3", dst=(9,))
    body = {
        "messages": [
            {"path": "/zbus-remote", "envelope": good.to_wire()},
            {"path": "/zbus-remote", "envelope": forged.to_wire()},
            {"path": "/zbus-reply", "envelope": reply.to_wire()},
            {"path": "/zbus-cmd", "envelope": good.to_wire()},
        ]
    }
    response = await http.post("/zbus-batch", content=json.dumps(body))
    assert response.status_code == 200
    assert response.json() == {
        "results": [
            {"status": 200},
            {"status": 400, "message": "couldn't verify signature"},
            {"status": 200},
            {"status": 400, "message": "couldn't parse json"},
        ]
    }
    assert [Envelope.decode(x) for x in await async_redis.lrange(SERVICE_QUEUE, 0, -1)] == [good]
    assert [Envelope.decode(x) for x in await async_redis.lrange(keys.REPLY, 0, -1)] == [reply]


@pytest.mark.parametrize("body", [b"", b"[]", b'{"messages": 3}', b'{"other": []}'])
async def test_a_body_that_is_not_a_batch_is_refused(http: httpx.AsyncClient, body: bytes) -> None:
    response = await http.post("/zbus-batch", content=body)
    assert response.status_code == 400
    assert error_of(response) == "couldn't parse json"


async def test_the_door_records_received_handed_over_duplicate_and_rejected_messages(
    async_redis: aioredis.Redis,
    resolver: StaticResolver,
    site_signer: Signer,
    ed_signer: Signer,
    clock: FixedClock,
    tmp_path: Path,
) -> None:
    events = EventLog(tmp_path, SITE_TWIN, clock=clock, host="h")
    door = Door(Store(async_redis), resolver, site_signer, freshness_s=60, clock=clock, events=events)
    env = request_from(ed_signer, ED_TWIN, uid=f"{SITE_TWIN}.9")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(door)), base_url="http://s"
    ) as http:
        for body in (env.encode(), env.encode(), b"{nope", request_from(ed_signer, 77).encode()):
            await http.post("/zbus-remote", content=body)
    events.close()
    lines = read_events(tmp_path)
    assert [(e["event"], e.get("uid"), e.get("src"), e.get("status")) for e in lines] == [
        ("received", env.uid, ED_TWIN, None),
        ("handed_to_service", env.uid, ED_TWIN, None),
        ("received", env.uid, ED_TWIN, None),
        ("duplicate", env.uid, ED_TWIN, None),
        ("rejected", None, None, 400),
        ("rejected", f"{SITE_TWIN}.1", 77, 400),
    ]
    assert lines[1]["queue"] == SERVICE_QUEUE
    assert lines[5]["error"] == "source twin 77 not found"


async def test_a_body_over_the_limit_is_refused_with_413_and_counted(
    async_redis: aioredis.Redis,
    resolver: StaticResolver,
    site_signer: Signer,
    ed_signer: Signer,
    clock: FixedClock,
) -> None:
    metrics = Metrics()
    door = Door(
        Store(async_redis), resolver, site_signer, clock=clock, metrics=metrics, max_message_bytes=2000
    )
    transport = httpx.ASGITransport(app=create_app(door))
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:
        declared = await http.post("/zbus-remote", content=b"x" * 2001)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"y" * 1000

        streamed = await http.post("/zbus-batch", content=chunks())
        fits = await http.post("/zbus-remote", content=request_from(ed_signer, ED_TWIN).encode())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert error_of(response) == "message too large: this site takes at most 2000 bytes"
    assert fits.status_code == 200
    assert await async_redis.llen(SERVICE_QUEUE) == 1
    body, _ = metrics.render()
    assert 'msgbus_errors_total{cause="too_large"} 2.0' in body.decode()


async def test_a_twin_over_its_rate_limit_gets_429_and_others_are_not_held_back(
    async_redis: aioredis.Redis,
    resolver: StaticResolver,
    site_signer: Signer,
    ed_signer: Signer,
    sr_signer: Signer,
    clock: FixedClock,
) -> None:
    buckets = TokenBuckets(rate=1, burst=2, clock=lambda: clock.now)
    door = Door(Store(async_redis), resolver, site_signer, clock=clock, rate_limit=buckets)
    transport = httpx.ASGITransport(app=create_app(door))
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:

        async def post(signer: Signer, twin: int, uid: str) -> httpx.Response:
            return await http.post("/zbus-remote", content=request_from(signer, twin, uid=uid).encode())

        statuses = [(await post(ed_signer, ED_TWIN, f"1.{n}")).status_code for n in range(3)]
        limited = await post(ed_signer, ED_TWIN, "1.9")
        other = await post(sr_signer, SR_TWIN, "1.10")
        clock.now += 1
        refilled = await post(ed_signer, ED_TWIN, "1.11")
    assert statuses == [200, 200, 429]
    assert limited.status_code == 429
    assert error_of(limited) == f"too many messages from twin {ED_TWIN}: the limit is 1 per second"
    assert other.status_code == 200, "another twin has its own bucket"
    assert refilled.status_code == 200, "a token comes back after a second"


async def test_the_openapi_document_describes_every_endpoint_of_a_site(
    async_redis: aioredis.Redis, resolver: StaticResolver, site_signer: Signer
) -> None:
    app = create_app(Door(Store(async_redis), resolver, site_signer))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:
        response = await http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    # The daemon adds /metrics, /healthz and /status (for this machine only) to the routes of create_app.
    served = app.paths() | {"/metrics", "/healthz", "/status"}
    assert served == set(document["paths"])
    envelope = document["components"]["schemas"]["Envelope"]["properties"]
    assert list(envelope) == list(Envelope().to_wire()), "every wire field, in wire order"
    for path in ("/zbus-remote", "/zbus-reply", "/zbus-cmd"):
        assert {"200", "400", "413", "429", "502", "503"} <= set(document["paths"][path]["post"]["responses"])


@pytest.mark.parametrize("path", ["/zbus-remote", "/zbus-batch"])
async def test_a_redis_that_cannot_take_the_message_is_a_503_with_retry_after(
    resolver: StaticResolver, site_signer: Signer, ed_signer: Signer, clock: FixedClock, path: str
) -> None:
    # A port nobody listens on: the site's Redis is away.
    away = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    metrics = Metrics()
    door = Door(Store(away), resolver, site_signer, freshness_s=60, clock=clock, metrics=metrics)
    env = request_from(ed_signer, ED_TWIN)
    body = env.encode()
    if path == "/zbus-batch":
        body = json.dumps({"messages": [{"path": "/zbus-remote", "envelope": env.to_wire()}]}).encode()
    transport = httpx.ASGITransport(app=create_app(door))
    async with httpx.AsyncClient(transport=transport, base_url="http://site") as http:
        response = await http.post(path, content=body)
    await away.aclose()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert error_of(response).startswith("couldn't queue the message, the site's redis failed")
    assert 'msgbus_errors_total{cause="redis"} 1.0' in metrics.render()[0].decode()
