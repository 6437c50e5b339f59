"""A cloud site and edge sites running the rules router, with real brokers and real HTTP services.

``RouterSites`` starts one cloud msgbusd (``--router-listen``) and edge msgbusds (``--router-cloud``, each
with its own mosquitto and servicebus port), every site with its own redis-server. Node names are the twin
map's names: ``site-1`` is the cloud, ``site-2`` ... the edges, unless ``names`` says otherwise.
``HttpRecorder`` is a real HTTP server that records what it is sent and answers as told; it can be stopped
and started again on the same port.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from router import keys, load_text, store
from router.store import RuleStatus
from testing.local_mqtt import MosquittoProcess
from testing.local_sites import LocalCluster, SiteProcess, free_port, wait_until


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str  # with the query string
    headers: dict[str, str]
    body: bytes


class HttpRecorder:
    """A threaded HTTP server on 127.0.0.1 that records every request and answers ``status`` with
    ``answer(request)`` as the body (the request's body by default), after ``delay_s``."""

    def __init__(self, port: int | None = None, backlog: int = 5) -> None:
        self.port = port or free_port()
        # Connections waiting to be accepted (the standard library's 5 resets some of a burst of callers).
        self.backlog = backlog
        self.requests: list[Recorded] = []
        self.status = 200
        # When set, the status to answer each request (instead of ``status``).
        self.status_for: Callable[[Recorded], int] | None = None
        self.delay_s = 0.0
        self.answer: Callable[[Recorded], bytes] = lambda recorded: recorded.body
        self.answer_headers: list[tuple[str, str]] = [("Content-Type", "application/octet-stream")]
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpRecorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                recorded = Recorded(self.command, self.path, dict(self.headers.items()), body)
                with recorder._lock:
                    recorder.requests.append(recorded)
                if recorder.delay_s:
                    time.sleep(recorder.delay_s)
                payload = recorder.answer(recorded)
                status_for = recorder.status_for
                self.send_response(recorder.status if status_for is None else status_for(recorded))
                for name, value in recorder.answer_headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler, bind_and_activate=False)
        server.request_queue_size = self.backlog
        try:
            server.server_bind()
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        self._server = server
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self, path_prefix: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith(path_prefix)]


def endpoints_yaml(service_port: int | None = None) -> str:
    """The three endpoints most tests use: ``rest``, ``eventbus`` and (with a port) ``servicebus``."""
    text = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: rest}
spec: {ruleEndpointType: rest}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: eventbus}
spec: {ruleEndpointType: eventbus}
"""
    if service_port is not None:
        text += f"""---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {{name: servicebus}}
spec: {{ruleEndpointType: servicebus, properties: {{service_port: "{service_port}"}}}}
"""
    return text


def rule_yaml(name: str, source: str, source_resource: str, target: str, target_resource: str) -> str:
    spec = f"source: {source}, sourceResource: {source_resource}, "
    spec += f"target: {target}, targetResource: {target_resource}"
    return f"""---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {{name: {name}}}
spec: {{{spec}}}
"""


@dataclass
class RouterSites:
    edges: int = 1
    # Extra msgbusd arguments for every site, the cloud only, and the edges only.
    extra_args: Sequence[str] = ("--retry-delay", "0.5", "--retry-max-delay", "2")
    cloud_args: Sequence[str] = ()
    edge_args: Sequence[str] = ("--router-refresh", "1")
    redis_appendonly: bool = False
    # Node names in the twin map: the cloud first, then the edges (default: site-1, site-2, ...).
    names: Sequence[str] = ()
    cluster: LocalCluster = field(init=False)
    brokers: list[MosquittoProcess] = field(default_factory=list)
    router_port: int = field(default_factory=free_port)
    servicebus_ports: list[int] = field(default_factory=list)

    @property
    def cloud(self) -> SiteProcess:
        return self.cluster.sites[0]

    def edge(self, index: int = 0) -> SiteProcess:
        return self.cluster.sites[1 + index]

    def node(self, index: int = 0) -> str:
        """The node name of edge ``index`` (its name in the twin map)."""
        return self.cluster.name_of(self.edge(index).twin)

    def rest_url(self, node: str, path: str) -> str:
        return f"http://127.0.0.1:{self.router_port}/{node}{path}"

    def servicebus_url(self, path: str, index: int = 0) -> str:
        return f"http://127.0.0.1:{self.servicebus_ports[index]}{path}"

    def prepare(self) -> RouterSites:
        self.cluster = LocalCluster(
            size=1 + self.edges, redis_appendonly=self.redis_appendonly, names=self.names
        ).prepare()
        try:
            self.cloud.extra_args = [
                *self.extra_args,
                *self.cloud_args,
                "--router-listen",
                f"127.0.0.1:{self.router_port}",
            ]
            for index in range(self.edges):
                broker = MosquittoProcess().start()
                self.brokers.append(broker)
                self.servicebus_ports.append(free_port())
                self.edge(index).extra_args = [
                    *self.extra_args,
                    *self.edge_args,
                    "--router-cloud",
                    self.cluster.name_of(self.cloud.twin),
                    "--mqtt",
                    f"mqtt://127.0.0.1:{broker.port}",
                    "--servicebus-listen",
                    f"127.0.0.1:{self.servicebus_ports[index]}",
                ]
        except BaseException:
            self.cleanup()
            raise
        return self

    def start(self) -> RouterSites:
        self.prepare()
        self.cluster.launch()
        return self

    def cloud_redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.cluster.redis[0].url)

    def edge_redis(self, index: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.cluster.redis[1 + index].url)

    def apply(self, yaml_text: str, *, wait_edges: bool = True) -> None:
        """Apply rules on the cloud and (by default) wait until every running edge learnt them."""
        with self.cloud_redis() as cloud:
            store.apply(cloud, load_text(yaml_text, "test rules"))
            version = store.catalog_version(cloud)
        if wait_edges:
            for index in range(self.edges):
                if self.edge(index).process is not None:
                    self.wait_learned(version, index)

    def learned_version(self, index: int = 0) -> int:
        import json

        with self.edge_redis(index) as edge:
            raw = edge.get(keys.LEARNED)
        return -1 if raw is None else int(json.loads(raw)["version"])

    def wait_learned(self, version: int, index: int = 0, timeout_s: float = 20.0) -> None:
        wait_until(
            lambda: self.learned_version(index) >= version,
            timeout_s,
            f"edge {index} learns version {version}",
        )

    def status(self, rule: str) -> RuleStatus:
        with self.cloud_redis() as cloud:
            return store.rule_status(cloud, rule)

    def cleanup(self) -> None:
        if hasattr(self, "cluster"):
            self.cluster.cleanup()
        for broker in self.brokers:
            broker.cleanup()
