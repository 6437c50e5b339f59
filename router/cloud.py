"""The cloud site's router: the REST ingress, and the commands edges send (eventbus->rest, servicebus->rest,
rules).

- ``/{node}/{path}`` and ``/{node}/{namespace}/{path}``, any method: the rule is found by path; a
  rest->eventbus message is accepted by the bus and answered ``202 {"message_id"}`` at once (the edge
  publishes it when it can, within its lifetime); a rest->servicebus call waits for the edge service's
  answer and returns it as it is (504 when none comes in time).
- Outcomes are counted per rule when they are known: the edge's reply, the caller's timeout, a newer keyed
  message, or the cloud URL's answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError
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
    JSON_TYPE,
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
from router.nodes import UnknownNode, node_twin
from router.outcomes import Outcome, Outcomes, Pending
from router.protocol import (
    CALL,
    CLOUD_REPLIES,
    DELIVER,
    FORWARD,
    KEY_HEADER,
    NODE_NAME_HEADER,
    PUBLISH,
    RULES,
    TTL_HEADER,
    Event,
    FrameError,
    HttpAnswer,
    HttpCall,
    decode_frame,
    encode_frame,
    passed_headers,
)
from router.routes import EVENTBUS, REST, SERVICEBUS, Route, RouteTable
from router.rules import EndpointType
from router.store import StoreError, decode_catalog
from router.validation import Catalog
from twin_resolver.base import Resolver, ResolverError
from wire.backoff import Backoff, sleep_unless
from wire.envelope import Envelope
from wire.error_texts import is_expired_text

log = logging.getLogger(__name__)

# Longest lifetime a caller may ask for with X-Msgbus-Ttl.
MAX_TTL_S = 7 * 24 * 3600
# A delivery attempt in progress is leased for this long beyond its HTTP timeout.
LEASE_MARGIN_S = 30.0
DELIVERY_BATCH = 64

Withdraw = Callable[[str], Awaitable[bool]]
REFUSED = "the bus refused the message (see the daemon's log)"

# KEYS: schedule. ARGV: now, lease until, limit. Due members, leased.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""


class CatalogCache:
    """The catalog as stored, re-read when its version changes (checked at most every ``check_s``)."""

    def __init__(self, redis: aioredis.Redis, check_s: float) -> None:
        self._redis = redis
        self._check_s = check_s
        self._table = RouteTable(Catalog(), -1)
        self.epoch = ""
        self._checked_at = -float("inf")

    async def table(self, *, fresh: bool = False) -> RouteTable:
        now = time.monotonic()
        if not fresh and now - self._checked_at < self._check_s:
            return self._table
        self._checked_at = now
        version, epoch = await self._redis.mget(keys.VERSION, keys.EPOCH)
        if int(version or 0) == self._table.version and _text(epoch) == self.epoch:
            return self._table
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.ENDPOINTS)
            pipe.hgetall(keys.RULES)
            pipe.get(keys.VERSION)
            pipe.get(keys.EPOCH)
            endpoints, rules, stored_version, epoch = await pipe.execute()
        try:
            self._table = RouteTable(decode_catalog(endpoints, rules), int(stored_version or 0))
            self.epoch = _text(epoch)
        except StoreError as exc:
            log.error("router: keeping the rules read before: %s", exc)
        return self._table


class CloudRouter:
    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        submit: bus.Submit,
        withdraw: Withdraw,
        resolver: Resolver,
        settings: RouterSettings,
        twin: int,
    ) -> None:
        self._redis = redis
        self._submit = bus.Coalescer(submit)
        self._withdraw = withdraw
        self._resolver = resolver
        self._settings = settings
        self._twin = twin
        self._catalog = CatalogCache(redis, settings.catalog_check_s)
        self._outcomes = Outcomes(redis)
        self._expect = bus.Coalescer(self._outcomes.expect_many)
        self._count = bus.Coalescer(self._outcomes.count_many)
        self._waiters = bus.Waiters()
        self._replies = bus.ReplyList(redis, CLOUD_REPLIES, self._on_replies)
        self._http = HttpClients(settings.http_timeout_s)
        self._backoff = Backoff(settings.retry_delay_s, settings.retry_max_delay_s)
        self._claim = redis.register_script(_CLAIM)
        self._attempts = asyncio.Semaphore(settings.workers)
        self._tasks: set[asyncio.Task[None]] = set()
        self.commands = command_service(
            redis,
            {DELIVER: self._deliver, FORWARD: self._forward, RULES: self._rules},
            name="cloud-router",
            workers=settings.workers,
            grace_s=settings.drain_grace_s,
        )

    # --- running -----------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                HttpRoute("/{node}/{path:path}", redis_guarded(self._ingress), methods=METHODS),
                HttpRoute("/{node}", redis_guarded(self._ingress), methods=METHODS),
            ]
        )

    async def run(self, stopping: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._replies.run(stopping), name="router replies")
            group.create_task(self.commands.serve(stopping=stopping), name="router commands")
            group.create_task(self._retry_deliveries(stopping), name="router deliveries")
            await stopping.wait()
        if self._tasks:
            # A POST cut short stays scheduled: it is made again after its lease.
            _, unfinished = await asyncio.wait(self._tasks, timeout=self._settings.drain_grace_s)
            for task in unfinished:
                task.cancel()
            if unfinished:
                await asyncio.wait(unfinished)
        await self._http.aclose()

    # --- the REST ingress --------------------------------------------------------------------------------

    async def _ingress(self, request: Request) -> Response:
        node = request.path_params["node"]
        path = "/" + request.path_params.get("path", "")
        try:
            body = await read_body(request, self._settings.max_body_bytes)
        except BodyTooLarge as exc:
            return json_error(413, str(exc))
        table = await self._catalog.table()
        found = table.rest(path)
        if found is None:  # perhaps a rule applied a moment ago
            table = await self._catalog.table(fresh=True)
            found = table.rest(path)
        if found is None:
            return json_error(404, f"no rule for path {path!r}", node=node)
        route, match = found
        try:
            twin = await node_twin(self._resolver, node)
        except UnknownNode as exc:
            return json_error(404, str(exc), node=node, rule=route.rule.name)
        except ResolverError as exc:
            return json_error(503, f"cannot look up node {node!r}: {exc}", node=node, rule=route.rule.name)
        if route.target.type is EVENTBUS:
            return await self._publish(request, route, table.version, twin, node, match.suffix, body)
        return await self._call(request, route, table.version, twin, node, match.suffix, body)

    async def _publish(
        self, request: Request, route: Route, version: int, twin: int, node: str, suffix: str, body: bytes
    ) -> Response:
        ttl_text = request.headers.get(TTL_HEADER)
        ttl = self._settings.message_ttl_s
        if ttl_text is not None:
            if not ttl_text.isdigit() or not 1 <= int(ttl_text) <= MAX_TTL_S:
                return json_error(
                    400, f"X-Msgbus-Ttl must be seconds from 1 to {MAX_TTL_S}, got {ttl_text!r}"
                )
            ttl = float(ttl_text)
        key = request.headers.get(KEY_HEADER, "")
        rule = route.rule.name
        message_id = uuid.uuid4().hex
        event = Event(message_id, rule, version, suffix, body)
        env = bus.request(
            twin, PUBLISH, event.encode(), message_id=message_id, lifetime_s=ttl, ret=CLOUD_REPLIES
        )
        uid = await self._send(env, rule)
        if uid is None:
            return json_error(500, REFUSED, rule=rule)
        await self._expect.one((uid, Pending(rule, twin, key), ttl))
        if key:
            await self._supersede(twin, key, uid)
        topic = route.rule.target_resource["topic"] + suffix
        answer = {"message_id": message_id, "rule": rule, "node": node, "twin": twin, "topic": topic}
        return Response(json.dumps(answer), 202, media_type=JSON_TYPE)

    async def _send(self, env: Envelope, rule: str) -> str | None:
        """Hand a message to the bus: its bus uid, or None when the bus refused it (counted as failed)."""
        uids = await self._submit.one(env)
        if uids is None:
            await self._count.one((rule, Outcome.FAIL, REFUSED))
            return None
        return uids[0]

    async def _supersede(self, twin: int, key: str, uid: str) -> None:
        """Make this message the newest of ``key``; drop the one before if it is still waiting for a node
        that did not take it."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hget(keys.latest(twin), key)
            pipe.hset(keys.latest(twin), key, uid)
            previous, _ = await pipe.execute()
        if previous is None:
            return
        older = previous.decode() if isinstance(previous, bytes) else str(previous)
        if older != uid and await self._withdraw(older):
            await self._outcomes.settle(older, Outcome.SUPERSEDED)
            log.info("router: message %s to twin %d dropped for the newer %s (key %r)", older, twin, uid, key)

    async def _call(
        self, request: Request, route: Route, version: int, twin: int, node: str, suffix: str, body: bytes
    ) -> Response:
        rule = route.rule.name
        message_id = uuid.uuid4().hex
        call = HttpCall(
            message_id,
            rule,
            version,
            request.method,
            suffix,
            request.url.query,
            passed_headers(request.headers.items()),
            body,
        )
        timeout = self._settings.call_timeout_s
        env = bus.request(
            twin, CALL, call.encode(), message_id=message_id, lifetime_s=timeout, ret=CLOUD_REPLIES
        )
        uid = await self._send(env, rule)
        if uid is None:
            return json_error(500, REFUSED, rule=rule)
        # Registered before anything else runs: the reply cannot have been taken yet.
        waiting = self._waiters.expect(uid)
        try:
            await self._expect.one((uid, Pending(rule, twin), timeout))
            reply = await asyncio.wait_for(waiting, timeout)
        except TimeoutError:
            error = f"no answer from node {node!r} (twin {twin}) within {timeout:g}s"
            await self._outcomes.settle(uid, Outcome.FAIL, error)
            return json_error(504, error, rule=rule, message_id=message_id)
        finally:
            self._waiters.forget(uid)
        return call_response(reply, f"node {node!r} (twin {twin})", timeout, rule=rule, message_id=message_id)

    async def _on_replies(self, replies: list[tuple[bytes, Envelope]]) -> None:
        settles = [(raw, reply.uid, *_outcome_of(reply)) for raw, reply in replies]
        await self._outcomes.settle_replies(self._replies.processing, settles)
        for _, reply in replies:
            self._waiters.resolve(reply.uid, reply, keep_if_early=reply.cmd == CALL)

    # --- commands from edges -----------------------------------------------------------------------------

    async def _edge_route(self, name: str, src: int, source: EndpointType) -> Route:
        route = (await self._catalog.table()).route(name) or (await self._catalog.table(fresh=True)).route(
            name
        )
        if route is None or route.source.type is not source or route.target.type is not REST:
            raise HandlerError(f"no {source.value}->rest rule named {name!r}")
        try:
            twin = await node_twin(self._resolver, route.node)
        except UnknownNode as exc:
            raise HandlerError(f"rule {name!r}: {exc}") from None
        if twin != src:
            raise HandlerError(f"rule {name!r} belongs to node {route.node!r}, not to twin {src}")
        return route

    async def _deliver(self, request: BusRequest) -> dict[str, object]:
        """eventbus->rest: POST to the rule's URL now; if that fails, keep it in Redis and try again."""
        event = Event.decode(request.data)
        route = await self._edge_route(event.rule, request.src, EVENTBUS)
        env = request.envelope
        header = {
            "id": event.id,
            "rule": route.rule.name,
            "node": route.node,
            "topic": event.topic,
            "url": route.rule.target_resource["resource"],
            "deadline": env.now + env.lifetime_s,
            "attempts": 0,
        }
        error = await self._post(header, event.body)
        if error is None:
            return {"delivered": True}
        await self._schedule(header, event.body, error)
        return {"delivered": False, "retrying": error}

    async def _post(self, header: dict[str, object], body: bytes) -> str | None:
        """One POST of a delivery; None when it succeeded (counted), else why it failed."""
        url = str(header["url"])
        try:
            reply = await self._http.request(
                "POST", url, content=body, headers=[(NODE_NAME_HEADER, str(header["node"]))]
            )
        except HttpFailed as exc:
            return f"POST {url} failed: {exc}"
        if not 200 <= reply.status < 300:
            return f"POST {url} answered {reply.status}"
        await self._count.one((str(header["rule"]), Outcome.SUCCESS, ""))
        return None

    async def _schedule(self, header: dict[str, object], body: bytes, error: str) -> None:
        attempts = int(str(header["attempts"])) + 1
        header = {**header, "attempts": attempts}
        rule = str(header["rule"])
        message_id = str(header["id"])
        if time.time() >= float(str(header["deadline"])):
            await self._forget_delivery(message_id)
            await self._count.one((rule, Outcome.FAIL, f"gave up after {attempts} attempt(s): {error}"))
            log.warning("router: gave up on message %s of rule %s: %s", message_id, rule, error)
            return
        due = time.time() + self._backoff.delay_s(attempts)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.DELIVERIES, message_id, encode_frame(header, body))
            pipe.zadd(keys.DELIVERY_SCHEDULE, {message_id: due})
            await pipe.execute()
        await self._outcomes.retried(rule, error)

    async def _forget_delivery(self, message_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.DELIVERIES, message_id)
            pipe.zrem(keys.DELIVERY_SCHEDULE, message_id)
            await pipe.execute()

    async def _retry_deliveries(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await sleep_unless(stopping, 0.2)
            try:
                now = time.time()
                lease = now + self._settings.http_timeout_s + LEASE_MARGIN_S
                due = await self._claim(keys=[keys.DELIVERY_SCHEDULE], args=[now, lease, DELIVERY_BATCH])
            except (RedisError, OSError) as exc:
                log.warning("router: cannot read the deliveries to retry: %s", exc)
                continue
            for member in due:
                message_id = member.decode() if isinstance(member, bytes) else str(member)
                await self._attempts.acquire()
                task = asyncio.create_task(self._retry_one(message_id))
                self._tasks.add(task)
                task.add_done_callback(self._attempt_done)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._attempts.release()

    async def _retry_one(self, message_id: str) -> None:
        try:
            raw = await self._redis.hget(keys.DELIVERIES, message_id)
            if raw is None:
                await self._forget_delivery(message_id)
                return
            header, body = decode_frame(raw if isinstance(raw, bytes) else raw.encode())
            error = await self._post(header, body)
            if error is None:
                await self._forget_delivery(message_id)
            else:
                await self._schedule(header, body, error)
        except (RedisError, OSError) as exc:
            log.warning("router: retrying message %s: redis failed (%s); it stays scheduled", message_id, exc)
        except FrameError as exc:
            log.error("router: dropping an unreadable delivery %s: %s", message_id, exc)
            await self._forget_delivery(message_id)

    async def _forward(self, request: BusRequest) -> bytes:
        """servicebus->rest: make the edge app's call to the rule's URL and return the answer."""
        call = HttpCall.decode(request.data)
        route = await self._edge_route(call.rule, request.src, SERVICEBUS)
        rule = route.rule.name
        url = join_url(route.rule.target_resource["resource"], call.suffix, call.query)
        headers = [*call.headers, (NODE_NAME_HEADER, route.node)]
        try:
            reply = await self._http.request(
                call.method, url, headers=headers, content=call.body, timeout_s=self._settings.call_timeout_s
            )
        except HttpFailed as exc:
            error = f"{call.method} {url} {'timed out' if exc.timed_out else 'failed'}: {exc}"
            await self._count.one((rule, Outcome.FAIL, error))
            return error_answer(504 if exc.timed_out else 502, error).encode()
        too_large = answer_too_large(f"{call.method} {url}", len(reply.body), self._settings.max_body_bytes)
        if too_large is not None:
            await self._count.one((rule, Outcome.FAIL, too_large))
            return error_answer(502, too_large).encode()
        if reply.status >= 400:
            await self._count.one((rule, Outcome.FAIL, f"{call.method} {url} answered {reply.status}"))
        else:
            await self._count.one((rule, Outcome.SUCCESS, ""))
        return HttpAnswer(reply.status, reply.headers, reply.body).encode()

    async def _rules(self, request: BusRequest) -> dict[str, object]:
        """The rules that concern the asking edge: its own edge-sourced rules and every REST-sourced one."""
        table = await self._catalog.table(fresh=True)
        own = []
        for route in table.routes.values():
            if not route.node:
                continue
            try:
                twin = await node_twin(self._resolver, route.node)
            except (UnknownNode, ResolverError):
                continue
            if twin == request.src:
                own.append(route.rule.name)
        objects = table.for_node(own)
        return {
            "version": table.version,
            "epoch": self._catalog.epoch,
            "cloud": self._twin,
            "objects": [obj.to_document() for obj in objects],
        }


def call_response(reply: Envelope, whom: str, timeout_s: float, **extra: object) -> Response:
    """The response to a call from what ``whom`` (the node) answered; ``extra`` goes into an error's body."""
    if is_expired_text(reply.err):
        # The site gave up on the request when its lifetime, this call's timeout, ran out: it can do so a
        # moment before this call's own timer does.
        return json_error(504, f"no answer from {whom} within {timeout_s:g}s", **extra)
    if reply.err:
        return json_error(502, f"{whom}: {reply.err}", **extra)
    try:
        answer = HttpAnswer.decode(reply.payload)
    except (FrameError, ValueError) as exc:
        return json_error(502, f"{whom} sent an unreadable answer: {exc}", **extra)
    return answer_response(answer)


def _outcome_of(reply: Envelope) -> tuple[Outcome, str]:
    if is_expired_text(reply.err):
        return Outcome.FAIL, f"no answer from twin {reply.src} in time ({reply.err})"
    if reply.err:
        return Outcome.FAIL, f"twin {reply.src}: {reply.err}"
    if reply.cmd != CALL:
        return Outcome.SUCCESS, ""
    try:
        answer = HttpAnswer.decode(reply.payload)
    except (FrameError, ValueError) as exc:
        return Outcome.FAIL, f"twin {reply.src} sent an unreadable answer: {exc}"
    if answer.status >= 400:
        return Outcome.FAIL, f"twin {reply.src}: the edge service answered {answer.status}"
    return Outcome.SUCCESS, ""


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")
