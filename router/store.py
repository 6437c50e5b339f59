"""The rules catalog and the rule counters in the cloud site's Redis (sync redis-py; keys in ``keys``).

Keys (all under ``msgbus.router.``):

- ``msgbus.router.endpoints`` (hash): endpoint name -> the RuleEndpoint as KubeEdge-shaped JSON;
- ``msgbus.router.rules`` (hash): rule name -> the Rule as KubeEdge-shaped JSON;
- ``msgbus.router.version`` (string int): bumped by every change of the two hashes;
- ``msgbus.router.counters.<rule>`` (hash): ``success`` and ``fail`` counts, HINCRBY only (written by the
  router, :mod:`router.outcomes`);
- ``msgbus.router.errors.<rule>`` (list): the latest errors as JSON ``{"at", "error"}``, newest first, capped.

An apply is all or nothing: the two hashes are WATCHed, read, the union of stored and new objects is
validated, and every write goes in one MULTI/EXEC; a concurrent change makes it start over. What to write
is decided by ``plan_apply``, a pure function, so an async caller can reuse it with its own I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import WatchError

from router import keys
from router.rules import (
    ENDPOINT,
    KINDS,
    RULE,
    STORED,
    DocumentError,
    RouterObject,
    RuleEndpoint,
    canonical_json,
    parse_document,
)
from router.validation import Catalog, check_no_repeats, validate

AnyRedis = Redis | Pipeline


class StoreError(Exception):
    """A request about stored objects that cannot be done; ``str()`` says why in one line."""


class NotFound(StoreError):
    pass


class Ambiguous(StoreError):
    """A name that is both a Rule and a RuleEndpoint, given without a kind."""


class InUse(StoreError):
    """An endpoint that rules still use."""


class Action(StrEnum):
    CREATED = "created"
    REPLACED = "replaced"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class Change:
    """What an apply does (or did) to one object."""

    action: Action
    obj: RouterObject


@dataclass(frozen=True)
class RecordedError:
    at_s: float  # unix time
    error: str


@dataclass(frozen=True)
class RuleStatus:
    name: str
    success: int
    fail: int
    last_errors: list[RecordedError]
    superseded: int = 0  # keyed messages dropped for a newer one
    retries: int = 0  # failed attempts that were tried again


def plan_apply(stored: Catalog, objects: Iterable[RouterObject]) -> list[Change]:
    """What applying ``objects`` over ``stored`` does, in the objects' order; raises ValidationError when
    the result would not be valid (then nothing may be written)."""
    objects = list(objects)
    check_no_repeats(objects)
    validate(stored.merged(objects))
    changes = []
    planned: set[tuple[str, str]] = set()
    for obj in objects:
        if (obj.kind, obj.name) in planned:  # an identical copy (check_no_repeats refused different ones)
            continue
        planned.add((obj.kind, obj.name))
        old = stored.get(obj.kind, obj.name)
        if old is None:
            action = Action.CREATED
        elif canonical_json(old) == canonical_json(obj):
            action = Action.UNCHANGED
        else:
            action = Action.REPLACED
        changes.append(Change(action, obj))
    return changes


def decode_catalog(endpoints: Mapping[Any, bytes | str], rules: Mapping[Any, bytes | str]) -> Catalog:
    """The catalog from the raw contents of the two hashes."""
    catalog = Catalog()
    for raw in endpoints.values():
        obj = _decode(raw)
        if isinstance(obj, RuleEndpoint):
            catalog.endpoints[obj.name] = obj
    for raw in rules.values():
        obj = _decode(raw)
        if not isinstance(obj, RuleEndpoint):
            catalog.rules[obj.name] = obj
    return catalog


def read_catalog(redis: AnyRedis) -> Catalog:
    """Every stored endpoint and rule."""
    return decode_catalog(redis.hgetall(keys.ENDPOINTS), redis.hgetall(keys.RULES))


def apply(redis: Redis, objects: Iterable[RouterObject]) -> list[Change]:
    """Store ``objects`` (replacing those of the same kind and name) atomically, after validating them
    together with what is stored; raises ValidationError and writes nothing when they do not fit."""
    objects = list(objects)
    with redis.pipeline() as pipe:
        while True:
            try:
                pipe.watch(keys.ENDPOINTS, keys.RULES)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
                changes = plan_apply(read_catalog(pipe), objects)
                pipe.multi()
                written = [change.obj for change in changes if change.action is not Action.UNCHANGED]
                for obj in written:
                    pipe.hset(_hash(obj.kind), obj.name, canonical_json(obj))
                if written:
                    pipe.incr(keys.VERSION)
                    pipe.setnx(keys.EPOCH, uuid.uuid4().hex)
                pipe.execute()
                return changes
            except WatchError:
                continue


def get(redis: AnyRedis, name: str, kind: str | None = None) -> RouterObject:
    """The stored object called ``name`` (of ``kind`` Rule or RuleEndpoint when given)."""
    return _find(read_catalog(redis), name, kind)


def delete(redis: Redis, name: str, kind: str | None = None) -> RouterObject:
    """Delete one object and return it; a rule's counters and errors go with it. An endpoint that rules
    use is refused (InUse), naming them."""
    with redis.pipeline() as pipe:
        while True:
            try:
                pipe.watch(keys.ENDPOINTS, keys.RULES)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
                catalog = read_catalog(pipe)
                obj = _find(catalog, name, kind)
                users = catalog.rules_using(name) if obj.kind == ENDPOINT else []
                if users:
                    raise InUse(f"RuleEndpoint {name!r} is used by rules: {', '.join(users)}")
                pipe.multi()
                pipe.hdel(_hash(obj.kind), name)
                if obj.kind == RULE:
                    pipe.delete(keys.counters(name), keys.last_errors(name))
                pipe.incr(keys.VERSION)
                pipe.execute()
                return obj
            except WatchError:
                continue


def catalog_version(redis: Redis) -> int:
    return int(redis.get(keys.VERSION) or 0)


def rule_status(redis: Redis, name: str) -> RuleStatus:
    """The counters and latest errors of one rule (zeros for a rule that has seen no message)."""
    with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.counters(name))
        pipe.lrange(keys.last_errors(name), 0, -1)
        counts, raw_errors = pipe.execute()
    errors = []
    for raw in raw_errors:
        entry = json.loads(raw)
        errors.append(RecordedError(float(entry["at"]), str(entry["error"])))
    return RuleStatus(
        name,
        int(counts.get(b"success", 0)),
        int(counts.get(b"fail", 0)),
        errors,
        superseded=int(counts.get(b"superseded", 0)),
        retries=int(counts.get(b"retries", 0)),
    )


def _find(catalog: Catalog, name: str, kind: str | None) -> RouterObject:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be Rule or RuleEndpoint, got {kind!r}")
    found = [obj for k in KINDS if kind in (None, k) and (obj := catalog.get(k, name)) is not None]
    if not found:
        raise NotFound(f"no {kind or 'Rule or RuleEndpoint'} named {name!r}")
    if len(found) > 1:
        raise Ambiguous(f"{name!r} is both a Rule and a RuleEndpoint: say which (--kind rule|endpoint)")
    return found[0]


def _hash(kind: str) -> str:
    return keys.ENDPOINTS if kind == ENDPOINT else keys.RULES


def _decode(raw: bytes | str) -> RouterObject:
    try:
        document: Any = json.loads(raw)
        return parse_document(document, STORED)
    except (ValueError, DocumentError) as exc:
        raise StoreError(f"a stored router object cannot be read: {exc}") from None
