"""Fault scenarios of the rules router: a real cloud site and a real edge site (msgbusd, Redis, mosquitto)
with real HTTP services, while daemons, the edge's broker and a cloud URL go away and answers get lost.
Each checks the router's promise: nothing lost, nothing executed twice, clear errors, exact counters.

Each scenario prints one JSON line of figures (messages, duplicates, seconds to drain after recovery).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis
from paho.mqtt.client import Client, ConnectFlags, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from router import keys, store
from router.protocol import CLOUD_REPLIES, DELIVER, EDGE_COMMANDS, EDGE_REPLIES, PUBLISH
from testing.local_sites import wait_until
from tests.support.router import HttpRecorder, RouterSites, endpoints_yaml, rule_yaml
from tests.support.tcp_proxy import TcpProxy
from wire import keys as bus_keys
from wire.envelope import Envelope

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(150)]

REST_MESSAGES = 200
EDGE_EVENTS = 50
OUTAGE_S = 20.0
# A generous bound on recovery after a fault: retries are at most 2 s apart on the bus here, and a cloud URL's
# deliveries back off from 1 s, doubling.
DRAIN_S = 60.0


# --- what edge apps and cloud apps do -------------------------------------------------------------------


class TopicWatcher:
    """An edge app subscribed (QoS 1) on an edge's broker, with a session the broker keeps across its
    restarts, that records every message it gets, duplicates included."""

    def __init__(self, port: int, topic_filter: str) -> None:
        self._filter = topic_filter
        self._lock = threading.Lock()
        self._payloads: list[bytes] = []
        self._subscribed = threading.Event()
        self._client = Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"watcher-{uuid.uuid4().hex[:12]}",
            clean_session=False,
            protocol=MQTTProtocolVersion.MQTTv311,
        )
        self._client.reconnect_delay_set(1, 1)
        self._client.on_connect = self._connected
        self._client.on_subscribe = self._acknowledged
        self._client.on_message = self._message
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        if not self._subscribed.wait(10):
            self.close()
            raise TimeoutError(f"no SUBACK for {topic_filter!r} on port {port}")

    def _connected(
        self, client: Client, userdata: Any, flags: ConnectFlags, code: ReasonCode, props: Properties | None
    ) -> None:
        client.subscribe(self._filter, qos=1)

    def _acknowledged(
        self, client: Client, userdata: Any, mid: int, codes: list[ReasonCode], props: Properties | None
    ) -> None:
        self._subscribed.set()

    def _message(self, client: Client, userdata: Any, message: MQTTMessage) -> None:
        with self._lock:
            self._payloads.append(bytes(message.payload))

    def payloads(self) -> Counter[bytes]:
        with self._lock:
            return Counter(self._payloads)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def publish(port: int, topic: str, payloads: Sequence[bytes]) -> None:
    """An edge app publishing QoS 1 on its broker; returns once the broker acknowledged every message."""
    client = Client(CallbackAPIVersion.VERSION2, client_id=f"app-{uuid.uuid4().hex[:12]}")
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        sent = [client.publish(topic, payload, qos=1) for payload in payloads]
        for info in sent:
            info.wait_for_publish(10)
            assert info.is_published(), f"the broker did not acknowledge a message on {topic!r}"
    finally:
        client.disconnect()
        client.loop_stop()


def http() -> httpx.Client:
    return httpx.Client(timeout=90, trust_env=False)


def post_all(
    url: str, bodies: Sequence[bytes], headers: dict[str, str] | None = None
) -> list[httpx.Response]:
    """A cloud app's REST calls, four at a time, in the order of ``bodies``."""
    with http() as client, ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda body: client.post(url, content=body, headers=headers), bodies))


def duplicates(counted: Counter[bytes]) -> int:
    return sum(times - 1 for times in counted.values())


def recorded_bodies(recorder: HttpRecorder, path: str) -> Counter[bytes]:
    return Counter(request.body for request in recorder.received(path))


# --- what the sites hold --------------------------------------------------------------------------------


def backlog(conn: redis.Redis, cmd: str | None = None) -> int:
    """Requests of this site still waiting for their outcome (of command ``cmd`` only, if given)."""
    raws = conn.hvals(bus_keys.BACKLOG)
    return sum(1 for raw in raws if cmd is None or Envelope.decode(raw).cmd == cmd)


def edge_router_idle(sites: RouterSites) -> bool:
    """No routed message is waiting in, or being handled by, the edge's router."""
    with sites.edge_redis() as edge:
        for cmd in EDGE_COMMANDS:
            queue = bus_keys.command_queue(cmd)
            if edge.llen(queue) or edge.llen(bus_keys.service_processing(queue, "edge-router")):
                return False
    return True


def settled(sites: RouterSites) -> bool:
    """Every message either site sent has its outcome: nothing more can arrive anywhere."""
    with sites.cloud_redis() as cloud, sites.edge_redis() as edge:
        if backlog(cloud) or backlog(edge) or cloud.hlen(keys.DELIVERIES):
            return False
        # Outcomes are counted when the router takes the reply from its return list.
        for conn, replies in ((cloud, CLOUD_REPLIES), (edge, EDGE_REPLIES)):
            if conn.llen(replies) or conn.llen(bus_keys.processing(replies)):
                return False
    return edge_router_idle(sites)


def metric(site_url: str, event: str) -> int:
    """The site's ``msgbus_messages_total`` counter of ``event``."""
    with http() as client:
        text = client.get(f"{site_url}/metrics").text
    found = re.search(rf'^msgbus_messages_total\{{event="{event}"\}} ([0-9.e+]+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def report(figures: dict[str, object]) -> None:
    print(json.dumps(figures))


@contextmanager
def router_sites(sites: RouterSites, *, launch: bool = True) -> Iterator[RouterSites]:
    """Start ``sites`` (or only prepare them), show the end of each site's log if the scenario fails, and
    clean up."""
    try:
        sites.start() if launch else sites.prepare()
        yield sites
    except BaseException:
        if hasattr(sites, "cluster"):
            for site in sites.cluster.sites:
                print(f"--- end of the log of twin {site.twin} ({site.log_path})")
                print("\n".join(site.log().splitlines()[-40:]))
        raise
    finally:
        sites.cleanup()


def eventbus_rule(name: str, topic: str, node: str, url: str) -> str:
    return rule_yaml(
        name, "eventbus", f"{{topic: {topic}, node_name: {node}}}", "rest", f'{{resource: "{url}"}}'
    )


def publish_rule(name: str, path: str, topic: str) -> str:
    return rule_yaml(name, "rest", f"{{path: {path}}}", "eventbus", f"{{topic: {topic}}}")


# --- the scenarios --------------------------------------------------------------------------------------


def test_1_edge_offline_20s_then_cloud_offline() -> None:
    api = HttpRecorder().start()
    with router_sites(RouterSites()) as sites:
        node = sites.node()
        sites.apply(
            endpoints_yaml()
            + publish_rule("f1-down", "/f1", "f1/down")
            + eventbus_rule("f1-up", "f1up", node, f"{api.url}/f1")
        )
        watcher = TopicWatcher(sites.brokers[0].port, "f1/down")
        try:
            # rest->eventbus while the edge's daemon is dead.
            sites.edge().kill()
            bodies = [f"f1 down {i}".encode() for i in range(REST_MESSAGES)]
            responses = post_all(sites.rest_url(node, "/f1"), bodies)
            assert [r.status_code for r in responses] == [202] * REST_MESSAGES, responses[0].text
            assert len({r.json()["message_id"] for r in responses}) == REST_MESSAGES
            time.sleep(OUTAGE_S)  # the outage's length is the scenario
            assert not watcher.payloads()
            assert sites.status("f1-down").success == 0
            with sites.cloud_redis() as cloud:
                assert backlog(cloud, PUBLISH) == REST_MESSAGES
            sites.edge().start()
            back = time.monotonic()
            wait_until(lambda: set(watcher.payloads()) >= set(bodies), DRAIN_S, "every message published")
            drain_down_s = time.monotonic() - back
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            published = watcher.payloads()
            status = sites.status("f1-down")
            assert set(published) == set(bodies)
            assert duplicates(published) == 0, published.most_common(3)
            assert (status.success, status.fail, status.superseded) == (REST_MESSAGES, 0, 0), status

            # eventbus->rest while the cloud's daemon is dead.
            sites.cloud.kill()
            events = [f"f1 up {i}".encode() for i in range(EDGE_EVENTS)]
            publish(sites.brokers[0].port, "default/f1up", events)
            # Acknowledged to the broker only once in the edge's Redis: all of them wait there.
            with sites.edge_redis() as edge:
                wait_until(lambda: backlog(edge, DELIVER) == EDGE_EVENTS, 20, "the events kept by the edge")
            sites.cloud.start()
            back = time.monotonic()
            wait_until(lambda: set(recorded_bodies(api, "/f1")) >= set(events), DRAIN_S, "every event")
            drain_up_s = time.monotonic() - back
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            arrived = recorded_bodies(api, "/f1")
            assert set(arrived) == set(events)
            assert duplicates(arrived) == 0, arrived.most_common(3)
            assert all(r.headers.get("NodeName") == node for r in api.received("/f1"))
            status = sites.status("f1-up")
            assert (status.success, status.fail) == (EDGE_EVENTS, 0), status
        finally:
            watcher.close()
            api.stop()
    report(
        {
            "scenario": "1. edge msgbusd down 20 s (kill -9), then cloud msgbusd down (kill -9)",
            "rest_to_eventbus": REST_MESSAGES,
            "published": sum(published.values()),
            "publish_duplicates": duplicates(published),
            "drain_after_edge_back_s": round(drain_down_s, 1),
            "eventbus_to_rest": EDGE_EVENTS,
            "posted": sum(arrived.values()),
            "post_duplicates": duplicates(arrived),
            "drain_after_cloud_back_s": round(drain_up_s, 1),
        }
    )


def test_2_cloud_url_down_then_back() -> None:
    api = HttpRecorder().start()
    with router_sites(RouterSites()) as sites:
        sites.apply(endpoints_yaml() + eventbus_rule("f2-up", "f2up", sites.node(), f"{api.url}/f2"))
        api.stop()
        try:
            events = [f"f2 up {i}".encode() for i in range(EDGE_EVENTS)]
            publish(sites.brokers[0].port, "default/f2up", events)
            # Twice per message at least: the deliveries are retried, not tried once and kept.
            wait_until(
                lambda: sites.status("f2-up").retries >= 2 * EDGE_EVENTS, 30, "two failed attempts each"
            )
            status = sites.status("f2-up")
            assert (status.success, status.fail) == (0, 0), status
            assert status.last_errors, status
            assert all(f"POST {api.url}/f2 failed" in e.error for e in status.last_errors), status.last_errors
            with sites.cloud_redis() as cloud:
                assert cloud.hlen(keys.DELIVERIES) == EDGE_EVENTS
            api.start()
            back = time.monotonic()
            wait_until(lambda: set(recorded_bodies(api, "/f2")) >= set(events), DRAIN_S, "every event")
            drain_s = time.monotonic() - back
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            arrived = recorded_bodies(api, "/f2")
            status = sites.status("f2-up")
        finally:
            api.stop()
    assert set(arrived) == set(events)
    assert duplicates(arrived) == 0, arrived.most_common(3)
    assert (status.success, status.fail) == (EDGE_EVENTS, 0), status
    report(
        {
            "scenario": "2. cloud URL of an eventbus->rest rule down, then back",
            "eventbus_to_rest": EDGE_EVENTS,
            "retries": status.retries,
            "posted": sum(arrived.values()),
            "post_duplicates": duplicates(arrived),
            "drain_after_url_back_s": round(drain_s, 1),
        }
    )


CALLS = 20


def test_3_servicebus_call_runs_once_when_answers_are_lost() -> None:
    service = HttpRecorder().start()
    service.answer = lambda recorded: b"done: " + recorded.body
    # Rules are learnt once at the start: no refresh traffic crosses the proxy while answers are dropped.
    # Pings are rare: a ping or pong lost to the proxy would close the cloud's link before the first call.
    # The cloud links to the edge at its first message (by default a single message goes in a POST).
    sites_args = RouterSites(
        extra_args=(*RouterSites.extra_args, "--link-ping", "60", "--link-after", "1"),
        edge_args=("--router-refresh", "60"),
    )
    with router_sites(sites_args, launch=False) as sites:
        edge = sites.edge()
        reserved = frozenset(
            {site.port for site in sites.cluster.sites} | {sites.router_port, *sites.servicebus_ports}
        )
        proxy = TcpProxy(("127.0.0.1", edge.port), avoid=reserved)
        try:
            edge.advertised_address = f"127.0.0.1:{proxy.port}"
            # In the cloud's Redis before the edge starts: the edge's first ask gets them.
            sites.apply(
                endpoints_yaml(service.port)
                + rule_yaml("f3-call", "rest", "{path: /f3}", "servicebus", "{path: /run}")
            )
            sites.cluster.launch()
            sites.wait_learned(1)
            url = sites.rest_url(sites.node(), "/f3")

            # A first call opens the cloud's link to the edge (a link cannot open while every answer is lost).
            with http() as client:
                warm = client.post(url, content=b"warm")
            assert (warm.status_code, warm.content) == (200, b"done: warm"), warm.text

            # Every answer of the edge is lost while the service takes its time: to the cloud the edge looks
            # down (it probes it, and the probes' answers are lost too), and the edge's answer reaches it
            # only through the edge's reply.
            proxy.drop_answers = 1.0
            service.delay_s = 3.0
            with http() as client:
                first = client.post(url, content=b"first")
            assert (first.status_code, first.content) == (200, b"done: first"), first.text
            assert proxy.dropped_answers >= 2, proxy.dropped_answers

            proxy.drop_answers = 0.5
            # Slower than the cloud's first re-send: many re-sends reach the edge while the call runs.
            service.delay_s = 1.0
            bodies = [f"f3 call {i}".encode() for i in range(CALLS)]
            responses = post_all(url, bodies)
            proxy.drop_answers = 0.0
            assert [(r.status_code, r.content) for r in responses] == [(200, b"done: " + b) for b in bodies]
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            executions = recorded_bodies(service, "/run")
            assert executions == Counter([b"warm", b"first", *bodies]), executions.most_common(3)
            with sites.edge_redis() as conn:
                done = [conn.get(key) for key in conn.scan_iter(keys.call_done("*"))]
            assert len(done) == CALLS + 2 and b"running" not in done
            status = sites.status("f3-call")
            assert (status.success, status.fail) == (CALLS + 2, 0), status
            # Calls sent again after a lost answer and not queued again; none when the edge's reply came
            # before the cloud sent again (a request with its outcome is not sent again).
            resent = metric(edge.url, "duplicate")
        finally:
            proxy.close()
            service.stop()
    report(
        {
            "scenario": "3. rest->servicebus with the edge's answers lost (all, then half)",
            "calls": CALLS + 2,
            "executions": sum(executions.values()),
            "answers_dropped": proxy.dropped_answers,
            "resent_and_not_queued_again": resent,
        }
    )


def test_4_rules_survive_restarts_of_both_sites() -> None:
    api = HttpRecorder().start()
    service = HttpRecorder().start()
    service.answer = lambda recorded: b"served: " + recorded.body
    with router_sites(RouterSites()) as sites:
        node = sites.node()
        rules = {
            "f4-down": publish_rule("f4-down", "/f4", "f4/down"),
            "f4-up": eventbus_rule("f4-up", "f4up", node, f"{api.url}/f4/up"),
            "f4-call": rule_yaml("f4-call", "rest", "{path: /f4call}", "servicebus", "{path: /run}"),
            "f4-report": rule_yaml(
                "f4-report",
                "servicebus",
                f'{{target_url: "http://127.0.0.1/f4/report", node_name: {node}}}',
                "rest",
                f'{{resource: "{api.url}/f4/report"}}',
            ),
        }
        sites.apply(endpoints_yaml(service.port) + "".join(rules.values()))
        version = sites.learned_version()
        watcher = TopicWatcher(sites.brokers[0].port, "f4/down")
        try:
            sites.edge().kill()
            sites.cloud.kill()
            sites.edge().start()
            assert sites.learned_version() == version

            # The cloud is down: the edge still takes its apps' messages, from the rules it kept.
            events = [f"f4 up {i}".encode() for i in range(EDGE_EVENTS)]
            publish(sites.brokers[0].port, "default/f4up", events)
            with sites.edge_redis() as edge:
                wait_until(lambda: backlog(edge, DELIVER) == EDGE_EVENTS, 20, "the events kept by the edge")
                # The broker resends what was not acknowledged when its subscriber reconnects, before anything
                # newer: once a message published after the edge's restart is kept, nothing more comes.
                sites.edge().stop()
                sites.edge().start()
                publish(sites.brokers[0].port, "default/f4up", [b"f4 up marker"])
                wait_until(lambda: backlog(edge, DELIVER) > EDGE_EVENTS, 20, "the marker kept by the edge")
                assert backlog(edge, DELIVER) == EDGE_EVENTS + 1
                events.append(b"f4 up marker")

            sites.cloud.start()
            back = time.monotonic()
            with sites.cloud_redis() as cloud:
                assert set(store.read_catalog(cloud).rules) == set(rules)
            wait_until(lambda: set(recorded_bodies(api, "/f4/up")) >= set(events), DRAIN_S, "every event")
            drain_s = time.monotonic() - back

            # Traffic of every kind.
            with http() as client:
                down = client.post(sites.rest_url(node, "/f4"), content=b"f4 down")
                call = client.post(sites.rest_url(node, "/f4call/x"), content=b"f4 call")
                report_answer = client.post(sites.servicebus_url("/f4/report"), content=b"f4 report")
            publish(sites.brokers[0].port, "default/f4up", [b"f4 up after"])
            assert down.status_code == 202, down.text
            assert (call.status_code, call.content) == (200, b"served: f4 call"), call.text
            assert [r.path for r in service.received()] == ["/run/x"]
            assert (report_answer.status_code, report_answer.content) == (200, b"f4 report"), (
                report_answer.text
            )
            wait_until(lambda: watcher.payloads()[b"f4 down"] >= 1, 20, "the rest->eventbus message")
            wait_until(lambda: b"f4 up after" in recorded_bodies(api, "/f4/up"), 20, "the last event")
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            arrived = recorded_bodies(api, "/f4/up")
            published = watcher.payloads()
            counts = {name: sites.status(name) for name in rules}
        finally:
            watcher.close()
            api.stop()
            service.stop()
    assert arrived == Counter([*events, b"f4 up after"]), arrived.most_common(3)
    assert published == Counter([b"f4 down"])
    assert recorded_bodies(api, "/f4/report") == Counter([b"f4 report"])
    expected = {"f4-down": 1, "f4-up": len(events) + 1, "f4-call": 1, "f4-report": 1}
    assert {name: (s.success, s.fail) for name, s in counts.items()} == {
        name: (success, 0) for name, success in expected.items()
    }
    report(
        {
            "scenario": "4. both msgbusd killed (-9); the edge alone, then the cloud",
            "eventbus_to_rest_while_cloud_down": len(events),
            "posted": sum(arrived.values()),
            "post_duplicates": duplicates(arrived),
            "drain_after_cloud_back_s": round(drain_s, 1),
        }
    )


KEYED = 5


def test_5_latest_wins_key() -> None:
    with router_sites(RouterSites()) as sites:
        node = sites.node()
        sites.apply(endpoints_yaml() + publish_rule("f5-down", "/f5", "f5/down"))
        watcher = TopicWatcher(sites.brokers[0].port, "f5/down")
        try:
            sites.edge().stop()
            latest = keys.latest(sites.edge().twin)
            url = sites.rest_url(node, "/f5")
            keyed = [f"f5 keyed {i}".encode() for i in range(KEYED)]
            with http() as client, sites.cloud_redis() as cloud:

                def send(body: bytes, headers: dict[str, str]) -> None:
                    response = client.post(url, content=body, headers=headers)
                    assert response.status_code == 202, response.text

                def newest_failed_once() -> bool:
                    uid = cloud.hget(latest, "f5-state")
                    return uid is not None and int(cloud.hget(bus_keys.ATTEMPTS, uid) or 0) >= 1

                for index, body in enumerate(keyed):
                    send(body, {"X-Msgbus-Key": "f5-state"})
                    # Only a message the edge failed to take may be dropped for a newer one.
                    wait_until(newest_failed_once, 20, f"keyed message {index} failed once")
                    if index == 1:
                        # Without a key, a message is never dropped, however many come after it.
                        send(b"f5 unkeyed", {})
                superseded_before = sites.status("f5-down").superseded
            sites.edge().start()
            back = time.monotonic()
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            drain_s = time.monotonic() - back
            published = watcher.payloads()
            status = sites.status("f5-down")
        finally:
            watcher.close()
    assert superseded_before == KEYED - 1
    assert published == Counter([keyed[-1], b"f5 unkeyed"]), published
    assert (status.success, status.fail, status.superseded) == (2, 0, KEYED - 1), status
    report(
        {
            "scenario": "5. latest-wins key while the edge is down",
            "keyed": KEYED,
            "unkeyed": 1,
            "published": sorted(body.decode() for body in published.elements()),
            "superseded": status.superseded,
            "drain_after_edge_back_s": round(drain_s, 1),
        }
    )


def test_6_edge_broker_down_then_back() -> None:
    # The edge is also stopped while it holds the messages: it must not wait for the broker to stop.
    with router_sites(RouterSites(edge_args=("--router-refresh", "1", "--drain-grace", "2"))) as sites:
        node = sites.node()
        sites.apply(endpoints_yaml() + publish_rule("f6-down", "/f6", "f6/down"))
        broker = sites.brokers[0]
        watcher = TopicWatcher(broker.port, "f6/down")
        try:
            broker.stop()
            bodies = [f"f6 down {i}".encode() for i in range(REST_MESSAGES)]
            responses = post_all(sites.rest_url(node, "/f6"), bodies)
            assert [r.status_code for r in responses] == [202] * REST_MESSAGES, responses[0].text

            def at_edge() -> int:
                with sites.edge_redis() as edge:
                    queue = bus_keys.command_queue(PUBLISH)
                    return int(edge.llen(queue)) + int(
                        edge.llen(bus_keys.service_processing(queue, "edge-router"))
                    )

            # Every message reached the edge, which holds it until its broker is back.
            wait_until(lambda: at_edge() == REST_MESSAGES, 30, "every message at the edge")
            assert sites.status("f6-down").success == 0
            # Stopped with SIGTERM (killed only if it does not exit within 15 s): it exits by itself, and
            # the messages it was holding wait in its Redis for the next start.
            assert sites.edge().stop() == 0
            assert at_edge() == REST_MESSAGES
            sites.edge().start()
            broker.start()
            back = time.monotonic()
            wait_until(lambda: set(watcher.payloads()) >= set(bodies), DRAIN_S, "every message published")
            drain_s = time.monotonic() - back
            wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
            published = watcher.payloads()
            status = sites.status("f6-down")
        finally:
            watcher.close()
    assert set(published) == set(bodies)
    assert duplicates(published) == 0, published.most_common(3)
    assert (status.success, status.fail) == (REST_MESSAGES, 0), status
    report(
        {
            "scenario": "6. the edge's MQTT broker down, then back",
            "rest_to_eventbus": REST_MESSAGES,
            "published": sum(published.values()),
            "publish_duplicates": duplicates(published),
            "drain_after_broker_back_s": round(drain_s, 1),
        }
    )


def test_7_edge_killed_while_a_servicebus_call_runs() -> None:
    service = HttpRecorder().start()
    service.delay_s = 3.0
    with router_sites(RouterSites()) as sites:
        sites.apply(
            endpoints_yaml(service.port)
            + rule_yaml("f7-call", "rest", "{path: /f7}", "servicebus", "{path: /run}")
        )
        answers: list[httpx.Response] = []
        with http() as client:
            caller = threading.Thread(
                target=lambda: answers.append(client.post(sites.rest_url(sites.node(), "/f7"), content=b"f7"))
            )
            caller.start()
            try:
                wait_until(lambda: len(service.received("/run")) == 1, 20, "the call made by the edge")
                # The edge dies with the call made and its answer not recorded: after its restart, the
                # message is handled again, and must not be executed again.
                sites.edge().kill()
                sites.edge().start()
            finally:
                caller.join()
        wait_until(lambda: settled(sites), DRAIN_S, "every outcome counted")
        status = sites.status("f7-call")
        service.stop()
    (answer,) = answers
    assert answer.status_code == 502, answer.text
    assert "already being handled" in answer.json()["error"], answer.text
    assert len(service.received("/run")) == 1
    assert (status.success, status.fail) == (0, 1), status
    assert "already being handled" in status.last_errors[0].error, status.last_errors
    report(
        {
            "scenario": "7. edge msgbusd killed (-9) while its service handles a rest->servicebus call",
            "calls": 1,
            "executions": len(service.received("/run")),
            "answer": answer.status_code,
        }
    )
