"""An edge site's router: the rules it learnt from its cloud site, the local MQTT broker, the local
services, and the servicebus port edge apps call.

- Rules are asked from the cloud at start, every ``refresh_s`` and whenever a message names a newer
  catalog or an unknown rule; they are kept in the edge's Redis, so routing goes on across restarts while
  the cloud is unreachable.
- rest->eventbus: the body is published (QoS 1) to the rule's topic plus the path suffix; the reply goes
  once the broker acknowledged it. A broker that is away is waited for, within the message's lifetime.
- rest->servicebus: the call is made to ``127.0.0.1:{service_port}`` of the rule's endpoint, once per
  message id: a message that comes again gets the answer of the first call, never a second call.
- eventbus->rest: messages on the subscribed topics are handed to the bus (durable in Redis) before they
  are acknowledged to the broker.
- servicebus->rest: an app's call to the servicebus port travels to the cloud, which makes it; the app
  gets the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as HttpRoute

from client.errors import HandlerError
from client.request import Request as BusRequest
from msgbusd.link.http_client import HttpClients
from msgbusd.link.http_reply import HttpFailed
from router import bus, keys
from router.commands import command_service
from router.config import RouterSettings
from router.http_common import (
    METHODS,
    BodyTooLarge,
    answer_response,
    answer_too_large,
    error_answer,
    join_url,
    json_error,
    read_body,
    redis_guarded,
)
from router.mqtt_bridge import (
    InvalidTopic,
    MqttBridge,
    MqttBridgeError,
    MqttSettings,
    PayloadTooLarge,
    PublishRefused,
)
from router.nodes import UnknownNode, node_twin
from router.protocol import (
    CALL,
    DELIVER,
    EDGE_REPLIES,
    FORWARD,
    PUBLISH,
    RULES,
    Event,
    FrameError,
    HttpAnswer,
    HttpCall,
    passed_headers,
)
from router.routes import EVENTBUS, REST, SERVICEBUS, Route, RouteTable
from router.rules import DocumentError, EndpointType, parse_document
from router.validation import Catalog
from twin_resolver.base import Resolver, ResolverError
from wire.backoff import sleep_unless
from wire.envelope import Envelope
from wire.error_texts import is_expired_text

log = logging.getLogger(__name__)

RUNNING = b"running"
# How long asking the cloud for rules may take before the edge goes on with what it has.
REFRESH_TIMEOUT_S = 5.0
FROM_CLOUD = "rules from the cloud"


class EdgeRouter:
    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        submit: bus.Submit,
        resolver: Resolver,
        settings: RouterSettings,
        twin: int,
    ) -> None:
        assert settings.cloud is not None
        self._redis = redis
        self._submit_many = submit
        self._submit = bus.Coalescer(submit)
        self._resolver = resolver
        self._settings = settings
        self._twin = twin
        self._cloud_name = settings.cloud
        self._cloud_twin: int | None = None
        self._table = RouteTable(Catalog(), -1)
        self._epoch = ""
        # The MQTT filters subscribed to (as recorded in Redis: the broker keeps them across restarts).
        self._subscribed: set[str] = set()
        self._waiters = bus.Waiters()
        self._replies = bus.ReplyList(redis, EDGE_REPLIES, self._on_replies)
        self._refresh_lock = asyncio.Lock()
        self._http = HttpClients(settings.call_timeout_s)
        self.mqtt: MqttBridge | None = None
        if settings.mqtt is not None:
            host, port = settings.mqtt
            self.mqtt = MqttBridge(
                MqttSettings(
                    client_id=f"msgbus-edge-{twin}",
                    host=host,
                    port=port,
                    max_payload_bytes=settings.max_body_bytes,
                ),
                on_batch=self._from_mqtt,
            )
        self.commands = command_service(
            redis,
            {PUBLISH: self._publish, CALL: self._call},
            name="edge-router",
            workers=settings.workers,
            grace_s=settings.drain_grace_s,
        )

    @property
    def table(self) -> RouteTable:
        return self._table

    # --- running -----------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                HttpRoute("/{path:path}", redis_guarded(self._servicebus), methods=METHODS),
            ]
        )

    async def run(self, stopping: asyncio.Event) -> None:
        await self._load_learned()
        if self.mqtt is not None:
            self.mqtt.start()
            await self._subscribe()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._replies.run(stopping), name="edge router replies")
                group.create_task(self.commands.serve(stopping=stopping), name="edge router commands")
                refreshing = group.create_task(self._refresh_forever(stopping), name="edge router rules")
                await stopping.wait()
                # A refresh waiting for a cloud that is away must not hold up the stop.
                refreshing.cancel()
        finally:
            if self.mqtt is not None:
                await self.mqtt.close()
            await self._http.aclose()

    async def _cloud(self) -> int:
        if self._cloud_twin is None:
            self._cloud_twin = await node_twin(self._resolver, self._cloud_name)
        return self._cloud_twin

    # --- rules -------------------------------------------------------------------------------------------

    async def _load_learned(self) -> None:
        subscribed = await self._redis.get(keys.SUBSCRIBED)
        with contextlib.suppress(ValueError, TypeError):
            self._subscribed = {str(f) for f in json.loads(subscribed or "[]")}
        raw = await self._redis.get(keys.LEARNED)
        if raw is None:
            return
        try:
            self._learn(json.loads(raw))
        except (ValueError, KeyError, TypeError, DocumentError) as exc:
            log.error("router: the rules kept from before cannot be read (%s); waiting for the cloud's", exc)
            return
        log.info(
            "router: %d rule(s) kept from before (version %d)", len(self._table.routes), self._table.version
        )

    def _learn(self, data: dict[str, Any]) -> bool:
        """Take a rules answer of the cloud; False when it is older than what is known (a late answer).
        A catalog started anew (another epoch) is taken whatever its version."""
        version = int(data["version"])
        epoch = str(data.get("epoch") or "")
        if epoch == self._epoch and version < self._table.version:
            return False
        objects = [parse_document(doc, FROM_CLOUD) for doc in data["objects"]]
        self._table = RouteTable(Catalog().merged(objects), version)
        self._epoch = epoch
        return True

    async def refresh(self, timeout_s: float = REFRESH_TIMEOUT_S) -> bool:
        """Ask the cloud for the rules now; False when no answer came in time (the old ones are kept)."""
        async with self._refresh_lock:
            try:
                cloud = await self._cloud()
            except (UnknownNode, ResolverError) as exc:
                log.error("router: cannot find the cloud site %r: %s", self._cloud_name, exc)
                return False
            message_id = uuid.uuid4().hex
            env = bus.request(
                cloud, RULES, b"{}", message_id=message_id, lifetime_s=timeout_s, ret=EDGE_REPLIES
            )
            if await self._ask(env, timeout_s) is None:
                log.info(
                    "router: no rules from the cloud (twin %d) within %gs; keeping mine", cloud, timeout_s
                )
                return False
            return True

    async def _ask(self, env: Envelope, timeout_s: float) -> Envelope | None:
        """Send a request to the cloud and wait for its reply; None when none came in time."""
        uids = await self._submit.one(env)
        if uids is None:
            raise HandlerError("the bus refused the message (see the daemon's log)")
        # Registered before anything else runs: the reply cannot have been taken yet.
        waiting = self._waiters.expect(uids[0])
        try:
            return await asyncio.wait_for(waiting, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._waiters.forget(uids[0])

    async def _refresh_forever(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.refresh()
            await sleep_unless(stopping, self._settings.refresh_s)

    async def _rules_arrived(self, reply: Envelope) -> None:
        if reply.err:
            log.error("router: the cloud refused to give rules: %s", reply.err)
            return
        try:
            data = json.loads(reply.payload)
            before = self._table.version
            if not self._learn(data):
                return
        except (ValueError, KeyError, TypeError, DocumentError) as exc:
            log.error("router: unreadable rules from the cloud: %s", exc)
            return
        # Subscribed before the rules are recorded: once they are, messages on their topics are taken.
        await self._subscribe()
        await self._redis.set(keys.LEARNED, json.dumps(data))
        if self._table.version != before:
            log.info("router: learnt %d rule(s), version %d", len(self._table.routes), self._table.version)

    async def _subscribe(self) -> None:
        """Subscribe to the topics of the eventbus rules, and drop the subscriptions of rules gone."""
        if self.mqtt is None:
            return
        wanted = self._table.subscriptions()
        gone = sorted(self._subscribed - set(wanted))
        try:
            # The bridge sends only the filters it does not have yet.
            if wanted:
                await self.mqtt.subscribe(*wanted)
            if gone:
                await self.mqtt.unsubscribe(*gone)
                log.info("router: no rule takes %s any more: unsubscribed", ", ".join(gone))
        except MqttBridgeError as exc:
            # Subscriptions, and subscriptions to drop, are sent again on every reconnect.
            log.warning("router: subscriptions to %s: %s", ", ".join([*wanted, *gone]), exc)
        if set(wanted) != self._subscribed:
            await self._redis.set(keys.SUBSCRIBED, json.dumps(wanted))
            self._subscribed = set(wanted)

    async def _route(self, name: str, version: int, kind: tuple[EndpointType, EndpointType]) -> Route:
        route = self._table.route(name)
        if route is None or version > self._table.version:
            await self.refresh()
            route = self._table.route(name)
        if route is None or route.kind != kind:
            raise HandlerError(f"rule {name!r} ({kind[0].value}->{kind[1].value}) is not known on this node")
        return route

    async def _check_cloud(self, src: int) -> None:
        try:
            cloud = await self._cloud()
        except (UnknownNode, ResolverError) as exc:
            raise HandlerError(f"this node cannot find its cloud site: {exc}") from None
        if src != cloud:
            raise HandlerError(f"this node takes router messages from twin {cloud} only, not from twin {src}")

    # --- replies to the edge's own requests --------------------------------------------------------------

    async def _on_replies(self, replies: list[tuple[bytes, Envelope]]) -> None:
        for _, reply in replies:
            if reply.cmd == RULES:
                await self._rules_arrived(reply)
            elif reply.cmd == DELIVER and reply.err:
                log.error("router: the cloud could not take message %s: %s", reply.uid, reply.err)
        await self._replies.ack([raw for raw, _ in replies])
        for _, reply in replies:
            self._waiters.resolve(reply.uid, reply, keep_if_early=reply.cmd in (RULES, FORWARD))

    # --- rest->eventbus ----------------------------------------------------------------------------------

    async def _publish(self, request: BusRequest) -> dict[str, str]:
        event = Event.decode(request.data)
        await self._check_cloud(request.src)
        route = await self._route(event.rule, event.version, (REST, EVENTBUS))
        if self.mqtt is None:
            raise HandlerError("this node has no MQTT broker (start msgbusd with --mqtt)")
        topic = route.rule.target_resource["topic"] + event.topic
        env = request.envelope
        deadline = env.now + env.lifetime_s
        while True:
            try:
                await self.mqtt.wait_connected(max(0.1, deadline - time.time()))
                await self.mqtt.publish(topic, event.body)
                return {"topic": topic}
            except (InvalidTopic, PayloadTooLarge, PublishRefused) as exc:
                raise HandlerError(f"publishing to {topic!r}: {exc}") from None
            except (TimeoutError, MqttBridgeError) as exc:
                if time.time() >= deadline:
                    raise HandlerError(
                        f"publishing to {topic!r}: the broker did not take it in time ({exc})"
                    ) from None
                log.warning("router: publishing to %r: %s; trying again", topic, exc or "broker away")

    # --- rest->servicebus --------------------------------------------------------------------------------

    async def _call(self, request: BusRequest) -> bytes:
        call = HttpCall.decode(request.data)
        await self._check_cloud(request.src)
        route = await self._route(call.rule, call.version, (REST, SERVICEBUS))
        done = keys.call_done(call.id)
        if not await self._redis.set(done, RUNNING, nx=True, ex=keys.CALL_DONE_TTL_S):
            earlier = await self._redis.get(done)
            if earlier is None or earlier == RUNNING:
                raise HandlerError(
                    f"message {call.id} was already being handled (its first call was cut short, e.g. by a "
                    "restart); it is not made again because it may have run"
                )
            return earlier if isinstance(earlier, bytes) else earlier.encode()
        answer = (await self._make_call(route, call)).encode()
        await self._redis.set(done, answer, ex=keys.CALL_DONE_TTL_S)
        return answer

    async def _make_call(self, route: Route, call: HttpCall) -> HttpAnswer:
        port = route.target.service_port
        url = join_url(
            f"http://127.0.0.1:{port}{route.rule.target_resource['path']}", call.suffix, call.query
        )
        try:
            reply = await self._http.request(call.method, url, headers=call.headers, content=call.body)
        except HttpFailed as exc:
            if exc.timed_out:
                return error_answer(504, f"the edge service at {url} did not answer: {exc}")
            return error_answer(502, f"the edge service at {url} cannot be reached: {exc}")
        too_large = answer_too_large(
            f"the edge service at {url}", len(reply.body), self._settings.max_body_bytes
        )
        if too_large is not None:
            return error_answer(502, too_large)
        return HttpAnswer(reply.status, reply.headers, reply.body)

    # --- eventbus->rest ----------------------------------------------------------------------------------

    async def _from_mqtt(self, messages: list[tuple[str, bytes]]) -> None:
        """Hand messages taken from the broker to the bus; returns once they are in Redis (raising leaves
        them unacknowledged, so the broker sends them again)."""
        envelopes = []
        ttl = self._settings.message_ttl_s
        for topic, payload in messages:
            routes = self._table.topic(topic)
            if not routes:
                log.info("router: no rule takes messages on %r; dropped", topic)
                continue
            cloud = await self._cloud()
            for route in routes:
                message_id = uuid.uuid4().hex
                event = Event(message_id, route.rule.name, self._table.version, topic, payload)
                envelopes.append(
                    bus.request(
                        cloud,
                        DELIVER,
                        event.encode(),
                        message_id=message_id,
                        lifetime_s=ttl,
                        ret=EDGE_REPLIES,
                    )
                )
        if envelopes:
            await self._submit_many(envelopes)

    # --- servicebus->rest --------------------------------------------------------------------------------

    async def _servicebus(self, request: Request) -> Response:
        path = "/" + request.path_params.get("path", "")
        try:
            body = await read_body(request, self._settings.max_body_bytes)
        except BodyTooLarge as exc:
            return json_error(413, str(exc))
        found = self._table.servicebus(path)
        if found is None and await self.refresh():
            found = self._table.servicebus(path)
        if found is None:
            return json_error(404, f"no servicebus rule of this node for path {path!r}")
        route, match = found
        try:
            cloud = await self._cloud()
        except (UnknownNode, ResolverError) as exc:
            return json_error(503, f"this node cannot find its cloud site: {exc}")
        message_id = uuid.uuid4().hex
        call = HttpCall(
            message_id,
            route.rule.name,
            self._table.version,
            request.method,
            match.suffix,
            request.url.query,
            passed_headers(request.headers.items()),
            body,
        )
        timeout = self._settings.call_timeout_s
        env = bus.request(
            cloud, FORWARD, call.encode(), message_id=message_id, lifetime_s=timeout, ret=EDGE_REPLIES
        )
        reply = await self._ask(env, timeout)
        # The site gives up on the request when its lifetime, this call's timeout, runs out: it can do so a
        # moment before this call's own timer does.
        if reply is None or is_expired_text(reply.err):
            return json_error(
                504, f"no answer through the cloud (twin {cloud}) within {timeout:g}s", rule=route.rule.name
            )
        if reply.err:
            return json_error(502, f"the cloud (twin {cloud}): {reply.err}", rule=route.rule.name)
        try:
            return answer_response(HttpAnswer.decode(reply.payload))
        except (FrameError, ValueError) as exc:
            return json_error(502, f"the cloud sent an unreadable answer: {exc}", rule=route.rule.name)
