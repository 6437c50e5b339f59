"""The rules router end to end: a cloud site and an edge site (msgbusd, redis-server and mosquitto processes),
real HTTP services and real MQTT clients. What arrives is checked byte for byte, and the rule counters
exactly, once every message of the rule is settled.

Most tests share one pair of sites and keep apart by their own rule names, paths, topics and URLs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest
from paho.mqtt.client import Client, ConnectFlags, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from router import keys, store
from router.protocol import CLOUD_REPLIES
from router.store import RuleStatus
from testing.local_sites import free_port, wait_until
from tests.support.metrics import samples
from tests.support.router import HttpRecorder, RouterSites, endpoints_yaml, rule_yaml
from wire import keys as wire_keys

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).parent / "examples"
MSGBUS = Path(sys.executable).parent / "msgbus"
LIMIT = 12 * 1024 * 1024
JSON_TYPE = "application/json"


# --- helpers -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MqttReceived:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class MqttClient:
    """A client of the test on an edge broker: subscribes (QoS 1) to ``filters`` before the constructor
    returns, records what arrives, and publishes QoS 1 messages, returning once the broker took them."""

    def __init__(self, port: int, *filters: str) -> None:
        self._filters = filters
        self._lock = threading.Lock()
        self._received: list[MqttReceived] = []
        self._ready = threading.Event()
        self._client = Client(CallbackAPIVersion.VERSION2, client_id=f"e2e-{uuid.uuid4().hex[:12]}")
        self._client.on_connect = self._connected
        self._client.on_subscribe = self._subscribed
        self._client.on_message = self._message
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        if not self._ready.wait(10):
            self.close()
            raise TimeoutError(f"no connection (or SUBACK) from the broker on port {port} within 10s")

    def __enter__(self) -> MqttClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    @property
    def received(self) -> list[MqttReceived]:
        with self._lock:
            return list(self._received)

    def publish(self, topic: str, payload: bytes, timeout_s: float = 30.0) -> None:
        info = self._client.publish(topic, payload, qos=1)
        info.wait_for_publish(timeout_s)
        assert info.is_published(), f"the broker did not acknowledge the message to {topic!r}"

    def _connected(
        self, client: Client, userdata: Any, flags: ConnectFlags, reason: ReasonCode, props: Properties | None
    ) -> None:
        if self._filters:
            client.subscribe([(topic_filter, 1) for topic_filter in self._filters])
        else:
            self._ready.set()

    def _subscribed(
        self, client: Client, userdata: Any, mid: int, reasons: list[ReasonCode], props: Properties | None
    ) -> None:
        self._ready.set()

    def _message(self, client: Client, userdata: Any, message: MQTTMessage) -> None:
        received = MqttReceived(message.topic, bytes(message.payload), message.qos, bool(message.retain))
        with self._lock:
            self._received.append(received)


def site_logs(sites: RouterSites, lines: int = 30) -> str:
    parts = []
    for label, site in (("cloud", sites.cloud), ("edge", sites.edge())):
        tail = site.log().splitlines()[-lines:]
        parts.append(f"--- {label} log, last {len(tail)} lines ---\n" + "\n".join(tail))
    return "\n".join(parts)


def waited(sites: RouterSites, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """``wait_until``, failing with the end of the sites' logs."""
    try:
        wait_until(condition, timeout_s, what)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{site_logs(sites)}")


def unsettled(sites: RouterSites, rule: str) -> int:
    """Messages of ``rule`` sent to an edge whose outcome is not counted yet."""
    with sites.cloud_redis() as cloud:
        names = list(cloud.scan_iter(match=keys.pending("*"), count=1000))
        records = cloud.mget(names) if names else []
    return sum(1 for raw in records if raw is not None and json.loads(raw)["rule"] == rule)


def settled(
    sites: RouterSites, rule: str, success: int, fail: int = 0, timeout_s: float = 20.0
) -> RuleStatus:
    """Wait until ``rule`` counted as many outcomes as expected and has none pending, then check the
    counters are exactly those."""

    def counted() -> bool:
        status = sites.status(rule)
        return status.success + status.fail >= success + fail and unsettled(sites, rule) == 0

    waited(sites, counted, timeout_s, f"rule {rule} to count {success} success and {fail} fail")
    status = sites.status(rule)
    assert (status.success, status.fail) == (success, fail), status
    return status


def shut_down(sites: RouterSites) -> None:
    """Stop the edges before the cloud (an edge stopping while its cloud is away waits for the rules it
    asked for), then clean up."""
    for index in range(sites.edges):
        sites.edge(index).stop()
    sites.cleanup()


def servicebus_endpoint(name: str, port: int) -> str:
    return f"""---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {{name: {name}}}
spec: {{ruleEndpointType: servicebus, properties: {{service_port: "{port}"}}}}
"""


def eventbus_to_rest(name: str, topic: str, node: str, url: str) -> str:
    """An eventbus->rest rule: messages on ``default/{topic}`` at ``node`` go to ``url``."""
    return rule_yaml(
        name, "eventbus", f"{{topic: '{topic}', node_name: {node}}}", "rest", f"{{resource: '{url}'}}"
    )


def servicebus_to_rest(name: str, target_url: str, node: str, url: str) -> str:
    """A servicebus->rest rule: calls of ``node``'s apps to the path of ``target_url`` go to ``url``."""
    source = f"{{target_url: '{target_url}', node_name: {node}}}"
    return rule_yaml(name, "servicebus", source, "rest", f"{{resource: '{url}'}}")


def lowered(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def error_of(response: httpx.Response) -> str:
    """The ``error`` of a JSON error answer (checking that it is one)."""
    assert response.headers["content-type"].startswith(JSON_TYPE), response.headers
    error = response.json()["error"]
    assert isinstance(error, str) and error
    return error


def mqtt_counter(http: httpx.Client, sites: RouterSites, what: str) -> float:
    """One of the edge's MQTT bridge counters, from its /metrics."""
    return samples(http.get(f"{sites.edge().url}/metrics").text)[f'msgbus_router_mqtt_total{{what="{what}"}}']


def recorder_on(port: int) -> HttpRecorder:
    """An HttpRecorder on a fixed port, or a clear failure when the port is taken."""
    try:
        return HttpRecorder(port).start()
    except OSError as exc:
        pytest.fail(
            f"port {port} is already taken on this machine ({exc}): the KubeEdge example files name it; "
            "free it to run this test"
        )


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sites() -> Iterator[RouterSites]:
    """A cloud site and one edge site, called ``edge-east`` in the twin map, with the endpoints ``rest``,
    ``eventbus`` and ``servicebus`` stored."""
    sites = RouterSites(names=("cloud", "edge-east")).start()
    try:
        # The servicebus endpoint is a source only here: its service port is never called.
        sites.apply(endpoints_yaml(free_port()))
        yield sites
    finally:
        shut_down(sites)


@pytest.fixture(scope="module")
def cloud_api() -> Iterator[HttpRecorder]:
    """The cloud HTTP API that eventbus->rest and servicebus->rest rules call; each test uses its own path."""
    recorder = HttpRecorder(backlog=128).start()
    try:
        yield recorder
    finally:
        recorder.stop()


@pytest.fixture
def edge_service() -> Iterator[HttpRecorder]:
    """An HTTP service next to the edge site, for a servicebus endpoint of the test's own."""
    recorder = HttpRecorder(backlog=512).start()
    try:
        yield recorder
    finally:
        recorder.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=60) as client:
        yield client


# --- the four rule kinds -----------------------------------------------------------------------------------


def test_rest_to_eventbus_publishes_the_body_on_the_topic_plus_the_path_suffix(
    sites: RouterSites, http: httpx.Client
) -> None:
    sites.apply(rule_yaml("e2e-r2e", "rest", "{path: /r2e}", "eventbus", "{topic: e2e/r2e/out}"))
    node = sites.node()
    body = bytes(range(256)) * 64 + b"\x00\r\n\xff end"
    with MqttClient(sites.brokers[0].port, "e2e/r2e/#") as subscriber:
        response = http.post(
            sites.rest_url(node, "/r2e/devices/7"),
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert response.status_code == 202, response.text
        answer = response.json()
        assert answer == {
            "message_id": answer["message_id"],
            "rule": "e2e-r2e",
            "node": node,
            "twin": sites.edge().twin,
            "topic": "e2e/r2e/out/devices/7",
        }
        assert len(answer["message_id"]) == 32
        # Any method; no body and no suffix: an empty payload on the rule's topic itself.
        assert http.delete(sites.rest_url(node, "/r2e")).status_code == 202

        waited(sites, lambda: len(subscriber.received) >= 2, 20, "both messages on the edge broker")
        assert sorted(subscriber.received, key=lambda m: m.topic) == [
            MqttReceived("e2e/r2e/out", b"", 1, False),
            MqttReceived("e2e/r2e/out/devices/7", body, 1, False),
        ]
    status = settled(sites, "e2e-r2e", success=2)
    assert status.last_errors == [] and status.retries == 0


def test_rest_to_servicebus_passes_the_call_through_and_the_answer_back(
    sites: RouterSites, http: httpx.Client, edge_service: HttpRecorder
) -> None:
    sites.apply(
        servicebus_endpoint("e2e-sb-basic", edge_service.port)
        + rule_yaml("e2e-r2s", "rest", "{path: /r2s}", "e2e-sb-basic", "{path: /service/v1}")
    )
    edge_service.status = 201
    edge_service.answer_headers = [("Content-Type", "text/plain; charset=utf-8"), ("X-Answer", "yes")]
    edge_service.answer = lambda recorded: b"created: " + recorded.body

    response = http.put(
        sites.rest_url(sites.node(), "/r2s/items/7?color=red&size=2"),
        content=b'{"weight": 3}',
        headers={"Content-Type": "application/json", "X-Request-Id": "req-1"},
    )

    assert response.status_code == 201, response.text
    assert response.headers["x-answer"] == "yes"
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    # The router's own server dates and names its answer, once.
    assert len(response.headers.get_list("date")) == 1, response.headers
    assert len(response.headers.get_list("server")) == 1, response.headers
    assert response.content == b'created: {"weight": 3}'
    (call,) = edge_service.requests
    assert (call.method, call.path, call.body) == (
        "PUT",
        "/service/v1/items/7?color=red&size=2",
        b'{"weight": 3}',
    )
    headers = lowered(call.headers)
    assert headers["content-type"] == "application/json"
    assert headers["x-request-id"] == "req-1"
    assert headers["host"] == f"127.0.0.1:{edge_service.port}"
    status = settled(sites, "e2e-r2s", success=1)
    assert status.last_errors == []


def test_eventbus_to_rest_posts_the_payload_with_the_node_name(
    sites: RouterSites, cloud_api: HttpRecorder
) -> None:
    node = sites.node()
    sites.apply(eventbus_to_rest("e2e-e2r", "e2e-e2r/up", node, f"{cloud_api.url}/e2r/in"))
    payload = b'{"temperature": 21.5}\x00\xff'
    with MqttClient(sites.brokers[0].port) as app:
        app.publish("default/e2e-e2r/up", payload)
        waited(sites, lambda: bool(cloud_api.received("/e2r/")), 20, "the POST to the cloud API")
    (post,) = cloud_api.received("/e2r/")
    assert (post.method, post.path, post.body) == ("POST", "/e2r/in", payload)
    assert lowered(post.headers)["nodename"] == node
    settled(sites, "e2e-e2r", success=1)


def test_eventbus_to_rest_tries_again_until_the_cloud_api_takes_it(sites: RouterSites) -> None:
    node = sites.node()
    api = HttpRecorder().start()
    try:
        api.status_for = lambda recorded: 503 if len(api.requests) == 1 else 200
        sites.apply(eventbus_to_rest("e2e-e2r-retry", "e2e-retry", node, f"{api.url}/retry"))
        with MqttClient(sites.brokers[0].port) as app:
            app.publish("default/e2e-retry", b"keep trying")
        status = settled(sites, "e2e-e2r-retry", success=1)
        assert [recorded.body for recorded in api.requests] == [b"keep trying", b"keep trying"]
        assert status.retries == 1
        assert "503" in status.last_errors[0].error
    finally:
        api.stop()


def test_servicebus_to_rest_makes_the_edge_apps_call_in_the_cloud(
    sites: RouterSites, http: httpx.Client, cloud_api: HttpRecorder
) -> None:
    node = sites.node()
    sites.apply(
        servicebus_to_rest("e2e-s2r", "http://127.0.0.1/s2r/report", node, f"{cloud_api.url}/s2r-api")
    )
    cloud_api.status_for = lambda recorded: 202 if recorded.path.startswith("/s2r-api") else 200
    try:
        response = http.patch(
            sites.servicebus_url("/s2r/report/daily?day=7"),
            content=b"edge report",
            headers={"X-App": "sensor"},
        )
    finally:
        cloud_api.status_for = None
    assert response.status_code == 202, response.text
    assert response.content == b"edge report"
    (call,) = cloud_api.received("/s2r-api")
    assert (call.method, call.path, call.body) == ("PATCH", "/s2r-api/daily?day=7", b"edge report")
    headers = lowered(call.headers)
    assert headers["nodename"] == node
    assert headers["x-app"] == "sensor"
    settled(sites, "e2e-s2r", success=1)


def test_rest_paths_with_a_namespace(sites: RouterSites, http: httpx.Client, cloud_api: HttpRecorder) -> None:
    node = sites.node()
    sites.apply(
        """---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: e2e-ns-rest, namespace: team-a}
spec: {source: rest, sourceResource: {path: /ns-in}, target: eventbus, targetResource: {topic: e2e/ns/out}}
"""
        + rule_yaml("e2e-ns-default", "rest", "{path: /ns-default}", "eventbus", "{topic: e2e/ns/default}")
        + f"""---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {{name: e2e-ns-up, namespace: team-a}}
spec:
  source: eventbus
  sourceResource: {{topic: e2e-ns-up, node_name: {node}}}
  target: rest
  targetResource: {{resource: '{cloud_api.url}/ns-up'}}
"""
    )
    with MqttClient(sites.brokers[0].port, "e2e/ns/#") as client:
        assert http.post(sites.rest_url(node, "/team-a/ns-in/x"), content=b"ns").status_code == 202
        # The default namespace, named or not.
        assert http.post(sites.rest_url(node, "/default/ns-default/y"), content=b"d1").status_code == 202
        assert http.post(sites.rest_url(node, "/ns-default"), content=b"d2").status_code == 202
        # A namespaced rule is not served without its namespace, nor under another.
        assert http.post(sites.rest_url(node, "/ns-in/x"), content=b"no").status_code == 404
        assert http.post(sites.rest_url(node, "/team-b/ns-in/x"), content=b"no").status_code == 404
        # Edge apps publish under the rule's namespace.
        client.publish("default/e2e-ns-up", b"not for team a")
        client.publish("team-a/e2e-ns-up", b"from team a")

        waited(sites, lambda: len(client.received) >= 3, 20, "three messages on the edge broker")
        assert sorted((m.topic, m.payload) for m in client.received) == [
            ("e2e/ns/default", b"d2"),
            ("e2e/ns/default/y", b"d1"),
            ("e2e/ns/out/x", b"ns"),
        ]
    settled(sites, "e2e-ns-rest", success=1)
    settled(sites, "e2e-ns-default", success=2)
    settled(sites, "e2e-ns-up", success=1)
    assert [recorded.body for recorded in cloud_api.received("/ns-up")] == [b"from team a"]


# --- the KubeEdge design document's examples, from its own files --------------------------------------------


@pytest.fixture
def kubeedge() -> Iterator[tuple[RouterSites, HttpRecorder, HttpRecorder]]:
    """Sites named as in the examples (edge ``edge-node-1``), the cloud API on 8080 and the edge service
    on 6666."""
    api = recorder_on(8080)
    try:
        service = recorder_on(6666)
        try:
            sites = RouterSites(names=("cloud", "edge-node-1")).start()
            try:
                yield sites, api, service
            finally:
                shut_down(sites)
        finally:
            service.stop()
    finally:
        api.stop()


def test_kubeedge_example_rest_to_eventbus(
    kubeedge: tuple[RouterSites, HttpRecorder, HttpRecorder], http: httpx.Client
) -> None:
    sites, _, _ = kubeedge
    sites.apply((EXAMPLES / "rest-to-eventbus.yaml").read_text())
    with MqttClient(sites.brokers[0].port, "test/#") as app:
        for path, body in (("/a", b"one"), ("/default/a", b"two"), ("/a/b/c", b"three")):
            response = http.post(sites.rest_url("edge-node-1", path), content=body)
            assert response.status_code == 202, response.text
        waited(sites, lambda: len(app.received) >= 3, 20, "three messages on the edge broker")
        assert sorted((m.topic, m.payload) for m in app.received) == [
            ("test", b"one"),
            ("test", b"two"),
            ("test/b/c", b"three"),
        ]
    settled(sites, "my-rule", success=3)


def test_kubeedge_example_eventbus_to_rest(kubeedge: tuple[RouterSites, HttpRecorder, HttpRecorder]) -> None:
    sites, api, _ = kubeedge
    sites.apply((EXAMPLES / "eventbus-to-rest.yaml").read_text())
    with MqttClient(sites.brokers[0].port) as app:
        app.publish("default/test", b'{"message": "hello from the edge"}')
        waited(sites, lambda: bool(api.requests), 20, "the POST to http://127.0.0.1:8080/test")
    (post,) = api.requests
    assert (post.method, post.path, post.body) == ("POST", "/test", b'{"message": "hello from the edge"}')
    assert lowered(post.headers)["nodename"] == "edge-node-1"
    settled(sites, "my-rule-eventbus-rest", success=1)


def test_kubeedge_example_rest_to_servicebus_and_back(
    kubeedge: tuple[RouterSites, HttpRecorder, HttpRecorder], http: httpx.Client
) -> None:
    sites, api, service = kubeedge
    sites.apply((EXAMPLES / "rest-to-servicebus.yaml").read_text())
    service.answer = lambda recorded: (
        b"service saw " + recorded.method.encode() + b" " + recorded.path.encode()
    )

    response = http.get(sites.rest_url("edge-node-1", "/a/x?y=1"))
    assert response.status_code == 200, response.text
    assert response.content == b"service saw GET /b/x?y=1"
    response = http.post(sites.rest_url("edge-node-1", "/a"), content=b"posted")
    assert response.content == b"service saw POST /b"
    assert [(r.method, r.path, r.body) for r in service.requests] == [
        ("GET", "/b/x?y=1", b""),
        ("POST", "/b", b"posted"),
    ]
    settled(sites, "my-rule-rest-servicebus", success=2)

    # The second rule: the edge service calls the path of target_url on the servicebus port.
    response = http.post(sites.servicebus_url("/report"), content=b"report from 6666")
    assert response.status_code == 200, response.text
    assert response.content == b"report from 6666"
    (report,) = api.requests
    assert (report.method, report.path, report.body) == ("POST", "/report", b"report from 6666")
    assert lowered(report.headers)["nodename"] == "edge-node-1"
    settled(sites, "my-rule-servicebus-rest", success=1)


# --- wildcard topics ---------------------------------------------------------------------------------------


def test_eventbus_sources_with_wildcards(sites: RouterSites, cloud_api: HttpRecorder) -> None:
    node = sites.node()
    sites.apply(
        eventbus_to_rest("e2e-plus", "e2e-wild/+/temp", node, f"{cloud_api.url}/wild-plus")
        + eventbus_to_rest("e2e-hash", "e2e-tree/#", node, f"{cloud_api.url}/wild-hash")
    )
    with MqttClient(sites.brokers[0].port) as app:
        for topic in (
            "default/e2e-wild/room1/temp",
            "default/e2e-wild/room2/temp",
            "default/e2e-wild/room1/humidity",  # not matching
            "default/e2e-wild/room1/deep/temp",  # not matching: + is one level
            "default/e2e-wild/temp",  # not matching: + is exactly one level
            "default/e2e-tree",  # # matches the parent level too
            "default/e2e-tree/a",
            "default/e2e-tree/a/b/c",
            "default/e2e-treetop/a",  # not matching
            "other/e2e-tree/a",  # not matching: another namespace
        ):
            app.publish(topic, topic.encode())
        # Published last: messages leave the broker in order, so once these are taken, so were the others.
        app.publish("default/e2e-wild/last/temp", b"last plus")
        app.publish("default/e2e-tree/last", b"last hash")
    plus = [b"default/e2e-wild/room1/temp", b"default/e2e-wild/room2/temp", b"last plus"]
    tree = [b"default/e2e-tree", b"default/e2e-tree/a", b"default/e2e-tree/a/b/c", b"last hash"]

    def bodies(path: str) -> list[bytes]:
        return sorted(recorded.body for recorded in cloud_api.received(path))

    # The cloud POSTs concurrently: the last ones published may arrive first.
    waited(
        sites,
        lambda: set(plus + tree) <= set(bodies("/wild-")),
        20,
        "every message on a matching topic",
    )
    settled(sites, "e2e-plus", success=3)
    settled(sites, "e2e-hash", success=4)
    assert bodies("/wild-plus") == plus
    assert bodies("/wild-hash") == tree


# --- size limits -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_rest_bodies_over_the_limit_are_refused_and_large_ones_go_through(
    sites: RouterSites, http: httpx.Client, edge_service: HttpRecorder
) -> None:
    node = sites.node()
    sites.apply(
        rule_yaml("e2e-size", "rest", "{path: /size}", "eventbus", "{topic: e2e/size}")
        + servicebus_endpoint("e2e-sb-size", edge_service.port)
        + rule_yaml("e2e-size-call", "rest", "{path: /size-call}", "e2e-sb-size", "{path: /echo}")
    )
    with MqttClient(sites.brokers[0].port, "e2e/size/#") as subscriber:
        response = http.post(sites.rest_url(node, "/size/over"), content=b"o" * (LIMIT + 1))
        assert response.status_code == 413
        assert str(LIMIT) in error_of(response)

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is found while reading
            for _ in range(LIMIT // (1024 * 1024)):
                yield b"c" * (1024 * 1024)
            yield b"c"

        response = http.post(sites.rest_url(node, "/size/chunked"), content=chunks())
        assert response.status_code == 413
        assert str(LIMIT) in error_of(response)

        large = bytes(range(256)) * 4096  # 1 MiB
        larger = large * 8
        for path, body in (("/size/large", large), ("/size/larger", larger)):
            response = http.post(sites.rest_url(node, path), content=body)
            assert response.status_code == 202, response.text
        waited(sites, lambda: len(subscriber.received) >= 2, 30, "the 1 MiB and 8 MiB messages on the broker")
        assert sorted((m.topic, m.payload) for m in subscriber.received) == [
            ("e2e/size/large", large),
            ("e2e/size/larger", larger),
        ]
    settled(sites, "e2e-size", success=2)

    response = http.post(sites.rest_url(node, "/size-call"), content=large)
    assert response.status_code == 200, response.text
    assert response.content == large
    assert [recorded.body for recorded in edge_service.requests] == [large]
    settled(sites, "e2e-size-call", success=1)


@pytest.mark.slow
def test_mqtt_payloads_over_the_limit_are_dropped(
    sites: RouterSites, http: httpx.Client, cloud_api: HttpRecorder
) -> None:
    node = sites.node()
    sites.apply(eventbus_to_rest("e2e-mqtt-size", "e2e-mqtt-size/+", node, f"{cloud_api.url}/mqtt-size"))
    large = bytes(range(256)) * 4096  # 1 MiB
    with MqttClient(sites.brokers[0].port) as app:
        app.publish("default/e2e-mqtt-size/over", b"o" * (LIMIT + 1))
        app.publish("default/e2e-mqtt-size/large", large)
        app.publish("default/e2e-mqtt-size/after", b"after")

    def bodies() -> list[bytes]:
        return sorted(recorded.body for recorded in cloud_api.received("/mqtt-size"))

    # The edge takes messages from the broker in order: once the later two are in, the first was dropped.
    waited(sites, lambda: len(bodies()) >= 2, 30, "the two messages under the limit")
    settled(sites, "e2e-mqtt-size", success=2)
    assert bodies() == sorted([large, b"after"])
    assert mqtt_counter(http, sites, "rejected") == 1
    rejection = f"{LIMIT + 1} bytes, over the limit of {LIMIT} bytes"
    lines = sites.edge().log().splitlines()
    assert any("rejected message" in line and rejection in line for line in lines), "\n".join(lines[-30:])


@pytest.mark.slow
def test_bodies_and_payloads_at_the_limit_are_delivered(http: httpx.Client) -> None:
    # Sites of its own, so that the large messages do not slow the other tests down.
    api = HttpRecorder().start()
    sites = RouterSites(names=("cloud", "edge-limit")).start()
    try:
        node = sites.node()
        sites.apply(
            endpoints_yaml()
            + rule_yaml("e2e-at-limit", "rest", "{path: /at-limit}", "eventbus", "{topic: e2e/at-limit}")
            + eventbus_to_rest("e2e-at-limit-up", "e2e-at-limit-up", node, f"{api.url}/at-limit")
        )
        body = b"L" * LIMIT
        with MqttClient(sites.brokers[0].port, "e2e/at-limit") as client:
            assert http.post(sites.rest_url(node, "/at-limit"), content=body).status_code == 202
            client.publish("default/e2e-at-limit-up", body)
            waited(sites, lambda: bool(client.received) and bool(api.requests), 60, "both deliveries")
            assert client.received[0].payload == body
            assert api.requests[0].body == body
    finally:
        shut_down(sites)
        api.stop()


# --- many at once ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_thousand_concurrent_rest_to_eventbus_calls(sites: RouterSites) -> None:
    count = 1000
    node = sites.node()
    sites.apply(rule_yaml("e2e-load", "rest", "{path: /load}", "eventbus", "{topic: e2e/load}"))
    bodies = [f"message {index}".encode() for index in range(count)]
    with MqttClient(sites.brokers[0].port, "e2e/load/#") as subscriber:
        limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
        async with httpx.AsyncClient(trust_env=False, timeout=120, limits=limits) as client:
            responses = await asyncio.gather(
                *(
                    client.post(sites.rest_url(node, f"/load/{i % 10}"), content=b)
                    for i, b in enumerate(bodies)
                )
            )
        assert Counter(response.status_code for response in responses) == {202: count}
        assert len({response.json()["message_id"] for response in responses}) == count
        await asyncio.to_thread(
            waited, sites, lambda: len(subscriber.received) >= count, 120, f"{count} messages on the broker"
        )
        await asyncio.to_thread(settled, sites, "e2e-load", count, 0, 120)
        received = subscriber.received
    assert Counter(message.payload for message in received) == Counter(bodies)
    assert all(m.topic == f"e2e/load/{int(m.payload.split()[1]) % 10}" for m in received)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_concurrent_rest_to_servicebus_calls_are_counted_exactly(
    sites: RouterSites, edge_service: HttpRecorder
) -> None:
    count = 200
    node = sites.node()
    sites.apply(
        servicebus_endpoint("e2e-sb-load", edge_service.port)
        + rule_yaml("e2e-call-load", "rest", "{path: /call-load}", "e2e-sb-load", "{path: /work}")
    )

    def failing(index: int) -> bool:
        return index % 7 == 0

    edge_service.status_for = lambda recorded: 500 if failing(int(recorded.path.rsplit("/", 1)[1])) else 200
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(trust_env=False, timeout=120, limits=limits) as client:
        responses = await asyncio.gather(
            *(
                client.post(sites.rest_url(node, f"/call-load/{i}"), content=b"call %d" % i)
                for i in range(count)
            )
        )
    for index, response in enumerate(responses):
        assert response.status_code == (500 if failing(index) else 200), (index, response.text)
        assert response.content == b"call %d" % index
    failures = sum(1 for index in range(count) if failing(index))
    assert len(edge_service.requests) == count
    status = await asyncio.to_thread(settled, sites, "e2e-call-load", count - failures, failures, 60)
    assert all("500" in error.error for error in status.last_errors)


# --- errors ------------------------------------------------------------------------------------------------


def test_unknown_node_and_unknown_path_are_404(sites: RouterSites, http: httpx.Client) -> None:
    sites.apply(rule_yaml("e2e-404", "rest", "{path: /known}", "eventbus", "{topic: e2e/known}"))

    response = http.post(sites.rest_url("no-such-node", "/known"), content=b"x")
    assert response.status_code == 404
    assert "no-such-node" in error_of(response)

    response = http.post(sites.rest_url(sites.node(), "/unknown/path"), content=b"x")
    assert response.status_code == 404
    assert "/unknown/path" in error_of(response)

    # Anchored: a rule path is not found in the middle of another path.
    response = http.post(sites.rest_url(sites.node(), "/x/known"), content=b"x")
    assert response.status_code == 404

    response = http.post(sites.servicebus_url("/no/servicebus/rule"), content=b"x")
    assert response.status_code == 404
    assert "/no/servicebus/rule" in error_of(response)
    assert sites.status("e2e-404") == RuleStatus("e2e-404", 0, 0, [])


def test_an_edge_service_that_is_down_is_a_502_counted_as_failed(
    sites: RouterSites, http: httpx.Client
) -> None:
    sites.apply(
        servicebus_endpoint("e2e-sb-down", free_port())
        + rule_yaml("e2e-down", "rest", "{path: /down}", "e2e-sb-down", "{path: /nothing}")
    )
    response = http.get(sites.rest_url(sites.node(), "/down/here"))
    assert response.status_code == 502
    assert "cannot be reached" in error_of(response)
    status = settled(sites, "e2e-down", success=0, fail=1)
    assert "502" in status.last_errors[0].error


def test_an_edge_service_that_resets_the_connection_is_a_502_saying_why(
    sites: RouterSites, http: httpx.Client
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        def reset_one() -> None:
            connection, _ = listener.accept()
            connection.recv(65536)
            # Linger 0: the close sends a reset.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

        resetter = threading.Thread(target=reset_one, daemon=True)
        resetter.start()
        sites.apply(
            servicebus_endpoint("e2e-sb-reset", listener.getsockname()[1])
            + rule_yaml("e2e-reset", "rest", "{path: /reset}", "e2e-sb-reset", "{path: /}")
        )
        response = http.get(sites.rest_url(sites.node(), "/reset"))
        resetter.join(10)
    assert response.status_code == 502
    error = error_of(response)
    assert "cannot be reached" in error
    assert not error.rstrip().endswith(":"), f"the error does not say why: {error!r}"
    settled(sites, "e2e-reset", success=0, fail=1)


def test_servicebus_to_rest_failures_reach_the_edge_app_and_are_counted(
    sites: RouterSites, http: httpx.Client, cloud_api: HttpRecorder
) -> None:
    node = sites.node()
    sites.apply(
        servicebus_to_rest("e2e-s2r-500", "http://edge/s2r-500", node, f"{cloud_api.url}/s2r-500")
        + servicebus_to_rest(
            "e2e-s2r-down", "http://edge/s2r-down", node, f"http://127.0.0.1:{free_port()}/nobody"
        )
    )
    cloud_api.status_for = lambda recorded: 500 if recorded.path.startswith("/s2r-500") else 200
    try:
        response = http.post(sites.servicebus_url("/s2r-500"), content=b"will fail")
    finally:
        cloud_api.status_for = None
    assert (response.status_code, response.content) == (500, b"will fail")
    status = settled(sites, "e2e-s2r-500", success=0, fail=1)
    assert "500" in status.last_errors[0].error

    response = http.post(sites.servicebus_url("/s2r-down"), content=b"nobody there")
    assert response.status_code == 502
    assert "nobody" in error_of(response)
    settled(sites, "e2e-s2r-down", success=0, fail=1)


@pytest.mark.slow
def test_a_slow_edge_service_is_a_504_counted_once_as_failed(http: httpx.Client) -> None:
    service = HttpRecorder().start()
    sites = RouterSites(names=("cloud", "edge-slow"), cloud_args=("--router-timeout", "2")).start()
    try:
        sites.apply(
            endpoints_yaml()
            + servicebus_endpoint("e2e-sb-slow", service.port)
            + rule_yaml("e2e-slow", "rest", "{path: /slow}", "e2e-sb-slow", "{path: /}")
        )
        service.delay_s = 4
        response = http.get(sites.rest_url(sites.node(), "/slow"))
        assert response.status_code == 504
        assert "within 2s" in error_of(response)
        assert response.json()["rule"] == "e2e-slow"
        status = settled(sites, "e2e-slow", success=0, fail=1)
        assert "no answer" in status.last_errors[0].error

        # The service's late answer reaches the cloud's site after the caller gave up (which of the router's
        # timer and the site's own expiry of the request came first, the call was answered 504 above): once
        # it has arrived and the router has taken every reply, the call is still counted once.
        def late_answer_dealt_with() -> bool:
            received = samples(http.get(f"{sites.cloud.url}/metrics").text).get(
                'msgbus_messages_total{event="reply_received"}', 0
            )
            with sites.cloud_redis() as cloud:
                waiting = cloud.llen(CLOUD_REPLIES) + cloud.llen(wire_keys.processing(CLOUD_REPLIES))
            return received >= 1 and waiting == 0

        waited(sites, late_answer_dealt_with, 20, "the late answer to reach the cloud")
        assert (sites.status("e2e-slow").success, sites.status("e2e-slow").fail) == (0, 1)

        service.delay_s = 0
        response = http.get(sites.rest_url(sites.node(), "/slow/again"))
        assert response.status_code == 200, response.text
        settled(sites, "e2e-slow", success=1, fail=1)
    finally:
        shut_down(sites)
        service.stop()


# --- rules change while everything runs --------------------------------------------------------------------


def test_rules_applied_later_are_used_without_a_restart(
    sites: RouterSites, http: httpx.Client, cloud_api: HttpRecorder, edge_service: HttpRecorder
) -> None:
    node = sites.node()
    assert http.post(sites.rest_url(node, "/later/x"), content=b"too early").status_code == 404
    with MqttClient(sites.brokers[0].port, "e2e/later/#") as client:
        # Used at once: neither site waits for its next look at the rules.
        sites.apply(
            rule_yaml("e2e-later", "rest", "{path: /later}", "eventbus", "{topic: e2e/later}")
            + servicebus_endpoint("e2e-sb-later", edge_service.port)
            + rule_yaml("e2e-later-call", "rest", "{path: /later-call}", "e2e-sb-later", "{path: /v2}"),
            wait_edges=False,
        )
        response = http.post(sites.rest_url(node, "/later/x"), content=b"just in time")
        assert response.status_code == 202, response.text
        response = http.post(sites.rest_url(node, "/later-call/y"), content=b"call me")
        assert (response.status_code, response.content) == (200, b"call me")
        assert [(r.path, r.body) for r in edge_service.requests] == [("/v2/y", b"call me")]
        waited(sites, lambda: bool(client.received), 20, "the message of the new rule")
        assert [(m.topic, m.payload) for m in client.received] == [("e2e/later/x", b"just in time")]

        # An edge-sourced rule: the edge subscribes to its topic once it learnt it.
        sites.apply(eventbus_to_rest("e2e-later-up", "e2e-later-up", node, f"{cloud_api.url}/later-up"))
        client.publish("default/e2e-later-up", b"new topic")
        waited(sites, lambda: bool(cloud_api.received("/later-up")), 20, "the POST of the new rule")
        settled(sites, "e2e-later-up", success=1)

        # A rule deleted: the edge drops its subscription once it learnt it, so its broker sends nothing
        # more of that topic (the message published before the marker is not even taken in).
        with sites.cloud_redis() as cloud:
            store.delete(cloud, "e2e-later-up")
            version = store.catalog_version(cloud)
        sites.wait_learned(version)
        delivered = mqtt_counter(http, sites, "delivered")
        client.publish("default/e2e-later-up", b"after the rule is gone")
        response = http.post(sites.rest_url(node, "/later/marker"), content=b"marker")
        assert response.status_code == 202, response.text
        waited(sites, lambda: len(client.received) == 2, 20, "the marker on the edge broker")
    assert [r.body for r in cloud_api.received("/later-up")] == [b"new topic"]
    assert mqtt_counter(http, sites, "delivered") == delivered
    settled(sites, "e2e-later", success=2)
    settled(sites, "e2e-later-call", success=1)


def test_rules_applied_with_the_cli_carry_traffic(
    sites: RouterSites, http: httpx.Client, tmp_path: Path
) -> None:
    rules_file = tmp_path / "cli-rules.yaml"
    rules_file.write_text(
        """apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: cli-rest}
spec: {ruleEndpointType: rest, properties: {}}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: cli-eventbus}
spec: {ruleEndpointType: eventbus, properties: {}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: cli-rule}
spec:
  source: cli-rest
  sourceResource: {path: /cli}
  target: cli-eventbus
  targetResource: {topic: e2e/cli}
"""
    )
    redis_url = sites.cluster.redis[0].url

    def msgbus(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(MSGBUS), "rules", *args, "--redis", redis_url], capture_output=True, text=True, timeout=30
        )

    applied = msgbus("apply", "-f", str(rules_file))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        "RuleEndpoint cli-rest created",
        "RuleEndpoint cli-eventbus created",
        "Rule cli-rule created",
    ]
    with MqttClient(sites.brokers[0].port, "e2e/cli/#") as client:
        response = http.post(sites.rest_url(sites.node(), "/cli/z"), content=b"via the cli")
        assert response.status_code == 202, response.text
        waited(sites, lambda: bool(client.received), 20, "the message of the rule applied with the CLI")
        assert [(m.topic, m.payload) for m in client.received] == [("e2e/cli/z", b"via the cli")]
    settled(sites, "cli-rule", success=1)
    shown = msgbus("status", "cli-rule")
    assert shown.returncode == 0, shown.stderr
    assert "success:    1\nfail:       0\n" in shown.stdout


def test_an_edge_follows_a_catalog_started_anew(http: httpx.Client) -> None:
    # Sites of their own: the cloud's Redis is wiped.
    sites = RouterSites(names=("cloud", "edge-anew")).start()
    try:
        node = sites.node()
        for index in range(3):
            sites.apply(
                endpoints_yaml()
                + rule_yaml(f"e2e-old-{index}", "rest", f"{{path: /old{index}}}", "eventbus", "{topic: old}")
            )
        assert sites.learned_version() == 3

        def learnt_rules() -> set[str]:
            with sites.edge_redis() as edge:
                learned = json.loads(edge.get(keys.LEARNED) or "{}")
            return {doc["metadata"]["name"] for doc in learned.get("objects", []) if doc["kind"] == "Rule"}

        # The cloud's Redis is wiped and the rules written again: the catalog's version starts from 1.
        with sites.cloud_redis() as cloud:
            cloud.flushall()
        sites.apply(
            endpoints_yaml()
            + rule_yaml("e2e-anew", "rest", "{path: /anew}", "eventbus", "{topic: e2e/anew}"),
            wait_edges=False,
        )
        waited(sites, lambda: learnt_rules() == {"e2e-anew"}, 20, "the edge to take the new catalog")
        with MqttClient(sites.brokers[0].port, "e2e/anew") as client:
            assert http.post(sites.rest_url(node, "/anew"), content=b"again").status_code == 202
            waited(sites, lambda: bool(client.received), 20, "the message of the new catalog")
        assert http.post(sites.rest_url(node, "/old0"), content=b"gone").status_code == 404
    finally:
        shut_down(sites)
