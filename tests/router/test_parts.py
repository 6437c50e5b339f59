"""The routing's pure parts: frames between the routers, the route table, node names, batching helpers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import redis.asyncio as aioredis
import typer

from msgbusd.site.cli import parse_mqtt_url
from router import load_text
from router.bus import Coalescer, Waiters
from router.cloud import CloudRouter, call_response
from router.config import RouterSettings
from router.http_common import join_url
from router.nodes import UnknownNode, node_twin
from router.protocol import Event, FrameError, HttpAnswer, HttpCall, decode_frame, passed_headers
from router.routes import RouteTable
from router.validation import Catalog
from testing.local_sites import free_port
from twin_resolver import StaticResolver, Twin
from wire.envelope import Envelope, encode_payload
from wire.error_texts import expired_text

CATALOG = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: rest}
spec: {ruleEndpointType: rest}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: eventbus}
spec: {ruleEndpointType: eventbus}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: servicebus}
spec: {ruleEndpointType: servicebus, properties: {service_port: "6666"}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: down}
spec: {source: rest, sourceResource: {path: /a}, target: eventbus, targetResource: {topic: t}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: down-prod, namespace: prod}
spec: {source: rest, sourceResource: {path: /a}, target: servicebus, targetResource: {path: /b}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: up}
spec:
  source: eventbus
  sourceResource: {topic: "sensors/+/temp", node_name: edge-1}
  target: rest
  targetResource: {resource: "http://cloud/up"}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: up-other-node}
spec:
  source: eventbus
  sourceResource: {topic: "#", node_name: edge-2}
  target: rest
  targetResource: {resource: "http://cloud/all"}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: report}
spec:
  source: servicebus
  sourceResource: {target_url: "http://127.0.0.1:8080/report", node_name: edge-1}
  target: rest
  targetResource: {resource: "http://cloud/report"}
"""


@pytest.fixture(scope="module")
def table() -> RouteTable:
    return RouteTable(Catalog().merged(load_text(CATALOG, "test")), 7)


def test_rest_paths_with_and_without_a_namespace(table: RouteTable) -> None:
    found = table.rest("/a/x/y")
    assert found is not None and (found[0].rule.name, found[1].suffix) == ("down", "/x/y")
    found = table.rest("/prod/a/z")
    assert found is not None and (found[0].rule.name, found[1].suffix) == ("down-prod", "/z")
    # A first segment that is a namespace without a matching rule there is an ordinary path segment.
    assert table.rest("/prod/nothing") is None
    assert table.rest("/b") is None


def test_topics_are_filters_under_the_namespace(table: RouteTable) -> None:
    assert [r.rule.name for r in table.topic("default/sensors/3/temp")] == ["up", "up-other-node"]
    assert [r.rule.name for r in table.topic("default/other")] == ["up-other-node"]
    assert table.subscriptions() == ["default/#", "default/sensors/+/temp"]


def test_servicebus_paths_come_from_the_target_url(table: RouteTable) -> None:
    found = table.servicebus("/report/daily")
    assert found is not None and (found[0].rule.name, found[1].suffix) == ("report", "/daily")
    assert table.servicebus("/elsewhere") is None


def test_an_edge_learns_rest_rules_and_its_own(table: RouteTable) -> None:
    names = [obj.name for obj in table.for_node(["up", "report"])]
    assert names == ["eventbus", "rest", "servicebus", "down", "down-prod", "report", "up"]


def test_frames_round_trip() -> None:
    call = HttpCall(
        "id1", "rule", 3, "PUT", "/x", "a=1&b=2", [("X-One", "1"), ("X-One", "2")], b"\x00\xffbody"
    )
    assert HttpCall.decode(call.encode()) == call
    answer = HttpAnswer(201, [("Set-Cookie", "a"), ("Set-Cookie", "b")], b"\n\nbinary\n")
    assert HttpAnswer.decode(answer.encode()) == answer
    event = Event("id2", "rule", 0, "/suffix", b"line1\nline2")
    assert Event.decode(event.encode()) == event


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"no header line", "no header line"),
        (b"{not json\n", "the header is not JSON"),
        (b"[1]\n", "not a JSON object"),
    ],
)
def test_bad_frames_are_clear_errors(payload: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        decode_frame(payload)


def test_frames_missing_fields() -> None:
    with pytest.raises(FrameError, match="'rule' must be a non-empty string"):
        Event.decode(b'{"id": "x"}\n')
    with pytest.raises(FrameError, match="status 99"):
        HttpAnswer.decode(b'{"status": 99}\n')


def test_hop_headers_stay_behind() -> None:
    headers = [("Host", "a"), ("Content-Length", "3"), ("Connection", "close"), ("X-Trace", "1")]
    assert passed_headers(headers) == [("X-Trace", "1")]


@pytest.mark.parametrize(
    ("base", "suffix", "query", "url"),
    [
        ("http://h/x", "", "", "http://h/x"),
        ("http://h/x/", "/y", "", "http://h/x/y"),
        ("http://h/x", "/y", "a=1", "http://h/x/y?a=1"),
        ("http://h/x?k=v", "", "a=1", "http://h/x?k=v&a=1"),
    ],
)
def test_join_url(base: str, suffix: str, query: str, url: str) -> None:
    assert join_url(base, suffix, query) == url


async def test_node_names_and_twin_ids() -> None:
    resolver = StaticResolver.from_twins([Twin(4, "h:1", b"\x01" * 32, "edge-1")])
    assert await node_twin(resolver, "edge-1") == 4
    assert await node_twin(resolver, "17") == 17
    with pytest.raises(UnknownNode, match="no twin is called 'edge-9'"):
        await node_twin(resolver, "edge-9")


async def test_names_need_a_source_that_has_names() -> None:
    class Chain:
        """A twin source without names, like the chain."""

    with pytest.raises(UnknownNode, match="use the node's twin id"):
        await node_twin(Chain(), "edge-1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "parsed"), [("mqtt://127.0.0.1:1884", ("127.0.0.1", 1884)), ("mqtt://broker", ("broker", 1883))]
)
def test_mqtt_urls(url: str, parsed: tuple[str, int]) -> None:
    assert parse_mqtt_url(url) == parsed


@pytest.mark.parametrize("url", ["tcp://h:1", "mqtt://", "mqtt://h:99999", "h:1883", "mqtt://h:1/x"])
def test_bad_mqtt_urls(url: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not mqtt://HOST:PORT"):
        parse_mqtt_url(url)


async def test_coalescer_serves_concurrent_callers_in_few_calls() -> None:
    calls: list[list[int]] = []

    async def double(items: list[int]) -> list[int]:
        calls.append(items)
        await asyncio.sleep(0)
        return [2 * item for item in items]

    coalescer = Coalescer(double)
    results = await asyncio.gather(*(coalescer.one(i) for i in range(10)))
    assert results == [2 * i for i in range(10)]
    assert sum(len(call) for call in calls) == 10 and len(calls) < 10


async def test_coalescer_gives_each_caller_the_error() -> None:
    async def fail(items: list[int]) -> list[int]:
        raise RuntimeError("redis is down")

    coalescer = Coalescer(fail)
    outcomes = await asyncio.gather(*(coalescer.one(i) for i in range(3)), return_exceptions=True)
    assert [str(outcome) for outcome in outcomes] == ["redis is down"] * 3


async def test_waiters_find_replies_that_came_first() -> None:
    waiters = Waiters(keep_early=2)
    for uid in ("1.1", "1.2", "1.3"):
        waiters.resolve(uid, Envelope(uid=uid), keep_if_early=True)
    waiters.resolve("1.4", Envelope(uid="1.4"))  # nobody waits and it is not kept
    assert (await waiters.expect("1.3")).uid == "1.3"
    assert (await waiters.expect("1.2")).uid == "1.2"
    late = waiters.expect("1.1")  # the oldest was dropped to keep two
    assert not late.done()
    waiters.resolve("1.1", Envelope(uid="1.1", err="x"))
    assert (await late).err == "x"
    assert not waiters.expect("1.4").done()


async def test_the_rest_door_answers_503_while_redis_is_away() -> None:
    async def never(envelopes: list[Envelope]) -> list[list[str] | None]:
        raise AssertionError("nothing is sent without Redis")

    async def never_withdraw(uid: str) -> bool:
        raise AssertionError("nothing is withdrawn without Redis")

    redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    router = CloudRouter(
        redis=redis,
        submit=never,
        withdraw=never_withdraw,
        resolver=StaticResolver.from_twins([]),
        settings=RouterSettings(listen=("127.0.0.1", 0)),
        twin=1,
    )
    transport = httpx.ASGITransport(app=router.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        response = await client.post("/edge-1/a", content=b"x")
    await redis.aclose()
    assert response.status_code == 503
    assert response.json()["error"].startswith("this site's Redis cannot be reached: ")


@pytest.mark.parametrize(
    ("reply", "status", "error"),
    [
        # The site expired the request a moment before the router's own timer ran out: a timeout all the same.
        (Envelope(src=7, err=expired_text(2)), 504, "no answer from node 'n' (twin 7) within 2s"),
        (Envelope(src=7, err="the service failed"), 502, "node 'n' (twin 7): the service failed"),
        (
            Envelope(src=7, dat=encode_payload(b"not a frame")),
            502,
            "node 'n' (twin 7) sent an unreadable answer",
        ),
    ],
)
def test_what_a_node_answered_becomes_the_calls_response(reply: Envelope, status: int, error: str) -> None:
    response = call_response(reply, "node 'n' (twin 7)", 2, rule="r")
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert body["error"].startswith(error)
    assert body["rule"] == "r"


def test_a_nodes_http_answer_is_the_calls_response() -> None:
    answer = HttpAnswer(201, [("x-kind", "made")], b"done")
    response = call_response(Envelope(src=7, dat=encode_payload(answer.encode())), "node 'n' (twin 7)", 2)
    assert (response.status_code, bytes(response.body), response.headers["x-kind"]) == (201, b"done", "made")
