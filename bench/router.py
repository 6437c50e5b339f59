"""Rules router benchmark: messages per second end to end, cloud REST to edge MQTT and back.

Two sites on this machine (a cloud with ``--router-listen``, an edge with ``--router-cloud`` and its own
mosquitto), each with its own redis-server, and a cloud API (``bench.http_sink``) in its own process.

- rest->eventbus: C concurrent callers POST N messages to ``/{node}/bench/...``; measured until an MQTT
  subscriber on the edge broker has every one, then until the rule's counters show them all delivered.
- eventbus->rest: an MQTT client publishes N messages (QoS 1) to ``default/up/...`` on the edge broker;
  measured until the cloud API has been POSTed every one.
- The floors, in the same run: the same callers POSTing straight to the cloud API, and the same MQTT client
  publishing straight to the subscriber through the broker (no bus in between).

One JSON line per row, then a Markdown table.

    python -m bench.router [--messages N] [--clients C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import redis
from paho.mqtt.client import Client, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion

from bench.rpc import cpu_seconds
from router import keys, load_text, store
from testing.local_mqtt import MosquittoProcess
from testing.local_sites import LocalCluster, free_port, port_open, wait_until

RULES = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {{name: rest}}
spec: {{ruleEndpointType: rest}}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {{name: eventbus}}
spec: {{ruleEndpointType: eventbus}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {{name: bench-down}}
spec: {{source: rest, sourceResource: {{path: /bench}}, target: eventbus, targetResource: {{topic: bench}}}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {{name: bench-up}}
spec:
  source: eventbus
  sourceResource: {{topic: "up/#", node_name: site-2}}
  target: rest
  targetResource: {{resource: "http://127.0.0.1:{sink_port}/up"}}
"""


@dataclass
class Setup:
    cluster: LocalCluster
    broker: MosquittoProcess
    router_port: int
    sink_port: int
    sink: subprocess.Popen[bytes]

    def daemon_cpu(self) -> float:
        return sum(cpu_seconds(site.process.pid) for site in self.cluster.sites if site.process is not None)

    def counters(self, rule: str) -> store.RuleStatus:
        with redis.Redis.from_url(self.cluster.redis[0].url) as cloud:
            return store.rule_status(cloud, rule)

    def sink_count(self) -> int:
        return int(httpx.get(f"http://127.0.0.1:{self.sink_port}/count").text)


@contextmanager
def running() -> Iterator[Setup]:
    broker = MosquittoProcess().start()
    router_port, sink_port = free_port(), free_port()
    sink = subprocess.Popen([sys.executable, "-m", "bench.http_sink", "--port", str(sink_port)])
    cluster = LocalCluster(size=2).prepare()
    try:
        cluster.sites[0].extra_args = ["--router-listen", f"127.0.0.1:{router_port}"]
        cluster.sites[1].extra_args = [
            "--router-cloud",
            "site-1",
            "--mqtt",
            f"mqtt://127.0.0.1:{broker.port}",
            "--servicebus-listen",
            f"127.0.0.1:{free_port()}",
            "--router-refresh",
            "1",
        ]
        cluster.launch()
        wait_until(lambda: port_open(sink_port), 20, "the cloud API")
        with redis.Redis.from_url(cluster.redis[0].url) as cloud:
            store.apply(cloud, load_text(RULES.format(sink_port=sink_port), "bench rules"))
            version = store.catalog_version(cloud)
        with redis.Redis.from_url(cluster.redis[1].url) as edge:
            wait_until(lambda: _learned(edge) >= version, 30, "the edge learns the rules")
        yield Setup(cluster, broker, router_port, sink_port, sink)
    finally:
        cluster.cleanup()
        broker.cleanup()
        sink.terminate()
        sink.wait()


def _learned(edge: redis.Redis) -> int:
    raw = edge.get(keys.LEARNED)
    return -1 if raw is None else int(json.loads(raw)["version"])


class Subscriber:
    """Counts the distinct messages arriving on a topic filter (QoS 1)."""

    def __init__(self, port: int, topic_filter: str) -> None:
        self.seen: set[bytes] = set()
        self.duplicates = 0
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = Client(
            CallbackAPIVersion.VERSION2, client_id=f"bench-sub-{port}-{time.monotonic_ns()}"
        )
        self._client.on_message = self._message
        self._client.on_subscribe = lambda *args: self._subscribed.set()
        self._client.on_connect = lambda client, *args: client.subscribe(topic_filter, qos=1)
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        if not self._subscribed.wait(10):
            raise RuntimeError("no SUBACK from the broker")

    def _message(self, client: Client, userdata: Any, message: MQTTMessage) -> None:
        with self._lock:
            if message.payload in self.seen:
                self.duplicates += 1
            self.seen.add(bytes(message.payload))

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def publish_all(port: int, topic: str, messages: int) -> None:
    """Publish ``messages`` QoS 1 messages (bodies ``0`` .. ``N-1``) and wait for every PUBACK."""
    client = Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{port}-{time.monotonic_ns()}")
    client.max_inflight_messages_set(256)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(f"{topic}/{i % 8}", str(i).encode(), qos=1) for i in range(messages)]
        for info in infos:
            info.wait_for_publish(60)
    finally:
        client.disconnect()
        client.loop_stop()


async def post_all(port: int, path_of: Callable[[int], str], messages: int, clients: int) -> list[float]:
    """POST ``messages`` bodies (``0`` .. ``N-1``) over ``clients`` keep-alive connections; the latencies of
    the answers. A plain HTTP/1.1 client, so that the load generator costs little next to what it measures."""
    latencies: list[float] = []
    next_index = iter(range(messages))

    async def caller() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in next_index:
                body = str(i).encode()
                head = f"POST {path_of(i)} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
                started = time.perf_counter()
                writer.write(head.encode() + body)
                status = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                answer = await reader.readexactly(length)
                if status.split()[1] not in (b"200", b"202"):
                    raise RuntimeError(f"message {i}: {status!r} {answer!r}")
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    await asyncio.gather(*(caller() for _ in range(clients)))
    return latencies


def rest_to_eventbus(setup: Setup, messages: int, clients: int) -> dict[str, Any]:
    subscriber = Subscriber(setup.broker.port, "bench/#")
    before = setup.counters("bench-down").success
    cpu = setup.daemon_cpu()
    started = time.perf_counter()
    latencies = asyncio.run(
        post_all(setup.router_port, lambda i: f"/site-2/bench/{i % 8}", messages, clients)
    )
    accepted_s = time.perf_counter() - started
    wait_until(lambda: subscriber.count() >= messages, 300, "every message on the edge broker")
    delivered_s = time.perf_counter() - started
    wait_until(lambda: setup.counters("bench-down").success - before >= messages, 120, "the counters")
    counted_s = time.perf_counter() - started
    cpu = setup.daemon_cpu() - cpu
    subscriber.close()
    return {
        "row": "rest->eventbus",
        "messages": messages,
        "clients": clients,
        "accepted_per_s": round(messages / accepted_s),
        "msgs_per_s": round(messages / delivered_s),
        "counted_per_s": round(messages / counted_s),
        "p50_ms_202": round(statistics.median(latencies) * 1000, 2),
        "p99_ms_202": round(sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1000, 2),
        "duplicates": subscriber.duplicates,
        "daemon_cpu_ms_per_msg": round(cpu * 1000 / messages, 3),
    }


def eventbus_to_rest(setup: Setup, messages: int) -> dict[str, Any]:
    before = setup.sink_count()
    cpu = setup.daemon_cpu()
    started = time.perf_counter()
    publish_all(setup.broker.port, "default/up", messages)
    published_s = time.perf_counter() - started
    wait_until(lambda: setup.sink_count() - before >= messages, 300, "every message at the cloud API")
    delivered_s = time.perf_counter() - started
    cpu = setup.daemon_cpu() - cpu
    return {
        "row": "eventbus->rest",
        "messages": messages,
        "accepted_per_s": round(messages / published_s),
        "msgs_per_s": round(messages / delivered_s),
        "extra_posts": setup.sink_count() - before - messages,
        "daemon_cpu_ms_per_msg": round(cpu * 1000 / messages, 3),
    }


def floor_http(setup: Setup, messages: int, clients: int) -> dict[str, Any]:
    before = setup.sink_count()
    started = time.perf_counter()
    asyncio.run(post_all(setup.sink_port, lambda i: "/floor", messages, clients))
    elapsed = time.perf_counter() - started
    assert setup.sink_count() - before == messages
    return {
        "row": "floor: POST straight to the cloud API",
        "messages": messages,
        "msgs_per_s": round(messages / elapsed),
    }


def floor_mqtt(setup: Setup, messages: int) -> dict[str, Any]:
    subscriber = Subscriber(setup.broker.port, "floor/#")
    started = time.perf_counter()
    publish_all(setup.broker.port, "floor", messages)
    wait_until(lambda: subscriber.count() >= messages, 120, "every message at the subscriber")
    elapsed = time.perf_counter() - started
    subscriber.close()
    return {
        "row": "floor: MQTT publish straight to a subscriber",
        "messages": messages,
        "msgs_per_s": round(messages / elapsed),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| row | messages | msgs/s end to end | accepted/s | daemon CPU ms/msg |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['row']} | {r['messages']} | {r['msgs_per_s']} | {r.get('accepted_per_s', '')} "
            f"| {r.get('daemon_cpu_ms_per_msg', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    rows = []
    with running() as setup:
        # A short warm-up of both directions (connections, scripts, JIT-free but cache-warm).
        rest_to_eventbus(setup, 200, args.clients)
        eventbus_to_rest(setup, 200)
        for row in (
            rest_to_eventbus(setup, args.messages, args.clients),
            eventbus_to_rest(setup, args.messages),
            floor_http(setup, args.messages, args.clients),
            floor_mqtt(setup, args.messages),
        ):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    main()
