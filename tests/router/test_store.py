"""The rules catalog and counters in a real Redis: atomic applies, guarded deletes, exact counts."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from router import keys, store
from router.loading import load_files, load_text
from router.outcomes import Outcome, Outcomes
from router.rules import Rule, RuleEndpoint
from router.store import Action
from router.validation import ValidationError

EXAMPLES = Path(__file__).parent / "examples"

RULE_TEXT = """
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {{name: my-rule}}
spec:
  source: my-rest
  sourceResource: {{path: "{path}"}}
  target: my-eventbus
  targetResource: {{topic: test}}
"""


def actions(changes: list[store.Change]) -> list[tuple[str, str, str]]:
    return [(change.obj.kind, change.obj.name, change.action.value) for change in changes]


def test_apply_creates_then_reports_unchanged_then_replaced(sync_redis: redis.Redis) -> None:
    objects = load_files([EXAMPLES / "rest-to-eventbus.yaml"])
    assert actions(store.apply(sync_redis, objects)) == [
        ("RuleEndpoint", "my-rest", "created"),
        ("RuleEndpoint", "my-eventbus", "created"),
        ("Rule", "my-rule", "created"),
    ]
    assert store.catalog_version(sync_redis) == 1
    epoch = sync_redis.get(keys.EPOCH)
    assert epoch is not None and len(epoch) == 32, "the catalog's first change names it"
    assert [c.action for c in store.apply(sync_redis, objects)] == [Action.UNCHANGED] * 3
    assert store.catalog_version(sync_redis) == 1  # nothing written, nothing bumped

    changes = store.apply(sync_redis, load_text(RULE_TEXT.format(path="/b/{id}"), "edit.yaml"))
    assert actions(changes) == [("Rule", "my-rule", "replaced")]
    assert store.catalog_version(sync_redis) == 2
    assert sync_redis.get(keys.EPOCH) == epoch, "later changes keep its name"
    rule = store.get(sync_redis, "my-rule")
    assert isinstance(rule, Rule) and rule.source_resource == {"path": "/b/{id}"}


def test_the_store_keeps_kubeedge_json_under_documented_keys(sync_redis: redis.Redis) -> None:
    store.apply(sync_redis, load_files([EXAMPLES / "rest-to-servicebus.yaml"]))
    assert sorted(sync_redis.hkeys(keys.ENDPOINTS)) == [b"my-rest", b"my-servicebus"]
    assert sorted(sync_redis.hkeys(keys.RULES)) == [b"my-rule-rest-servicebus", b"my-rule-servicebus-rest"]
    assert json.loads(sync_redis.hget(keys.ENDPOINTS, "my-servicebus") or b"") == {
        "apiVersion": "rules.kubeedge.io/v1",
        "kind": "RuleEndpoint",
        "metadata": {"name": "my-servicebus", "labels": {"description": "test"}},
        "spec": {"ruleEndpointType": "servicebus", "properties": {"service_port": "6666"}},
    }


def test_an_apply_with_one_bad_document_writes_nothing(sync_redis: redis.Redis) -> None:
    store.apply(sync_redis, load_files([EXAMPLES / "rest-to-eventbus.yaml"]))
    before = (sync_redis.hgetall(keys.ENDPOINTS), sync_redis.hgetall(keys.RULES))
    # A new endpoint and a good rule, plus one rule that takes a path already used: all refused.
    text = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: my-servicebus}
spec: {ruleEndpointType: servicebus, properties: {service_port: "6666"}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: fine}
spec: {source: my-rest, sourceResource: {path: /fine}, target: my-servicebus, targetResource: {path: /f}}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: clash}
spec: {source: my-rest, sourceResource: {path: /a/}, target: my-servicebus, targetResource: {path: /c}}
"""
    with pytest.raises(ValidationError) as caught:
        store.apply(sync_redis, load_text(text, "new.yaml"))
    assert caught.value.problems == [
        "new.yaml, document 3 (Rule clash): spec.sourceResource: source path '/a/' is already used by rule "
        "'my-rule'"
    ]
    assert (sync_redis.hgetall(keys.ENDPOINTS), sync_redis.hgetall(keys.RULES)) == before
    assert store.catalog_version(sync_redis) == 1


def test_a_rule_can_refer_to_endpoints_already_stored(sync_redis: redis.Redis) -> None:
    store.apply(sync_redis, load_files([EXAMPLES / "rest-to-eventbus.yaml"])[:2])
    assert actions(store.apply(sync_redis, load_text(RULE_TEXT.format(path="/z"), "r.yaml"))) == [
        ("Rule", "my-rule", "created")
    ]


def test_changing_an_endpoint_type_is_checked_against_the_rules_that_use_it(sync_redis: redis.Redis) -> None:
    store.apply(sync_redis, load_files([EXAMPLES / "rest-to-eventbus.yaml"]))
    text = "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata: {name: my-eventbus}\n"
    text += "spec: {ruleEndpointType: rest}\n"
    with pytest.raises(ValidationError, match=r"^stored \(Rule my-rule\): spec: rule kind rest->rest is not"):
        store.apply(sync_redis, load_text(text, "e.yaml"))
    endpoint = store.get(sync_redis, "my-eventbus")
    assert isinstance(endpoint, RuleEndpoint) and endpoint.type.value == "eventbus"


async def test_delete_refuses_an_endpoint_in_use_and_removes_a_rule_with_its_counters(
    sync_redis: redis.Redis, async_redis: aioredis.Redis
) -> None:
    store.apply(
        sync_redis, load_files([EXAMPLES / "rest-to-eventbus.yaml", EXAMPLES / "eventbus-to-rest.yaml"])
    )
    with pytest.raises(store.InUse) as caught:
        store.delete(sync_redis, "my-rest")
    assert str(caught.value) == "RuleEndpoint 'my-rest' is used by rules: my-rule, my-rule-eventbus-rest"

    outcomes = Outcomes(async_redis, clock=lambda: 5.0)
    await outcomes.count("my-rule", Outcome.SUCCESS)
    await outcomes.count("my-rule", Outcome.FAIL, "edge broker refused")
    assert sync_redis.exists(keys.counters("my-rule"), keys.last_errors("my-rule")) == 2
    deleted = store.delete(sync_redis, "my-rule", "Rule")
    assert deleted.name == "my-rule"
    assert not sync_redis.exists(keys.counters("my-rule"), keys.last_errors("my-rule"))
    store.delete(sync_redis, "my-rule-eventbus-rest")
    store.delete(sync_redis, "my-rest")
    assert sorted(store.read_catalog(sync_redis).endpoints) == ["my-eventbus"]
    assert store.catalog_version(sync_redis) == 4


def test_get_and_delete_name_what_is_missing_or_ambiguous(sync_redis: redis.Redis) -> None:
    text = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: twin}
spec: {ruleEndpointType: rest}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: bus}
spec: {ruleEndpointType: eventbus}
---
apiVersion: rules.kubeedge.io/v1
kind: Rule
metadata: {name: twin}
spec: {source: twin, sourceResource: {path: /t}, target: bus, targetResource: {topic: t}}
"""
    store.apply(sync_redis, load_text(text, "t.yaml"))
    with pytest.raises(store.NotFound, match=r"^no Rule or RuleEndpoint named 'nothing'$"):
        store.get(sync_redis, "nothing")
    with pytest.raises(store.NotFound, match=r"^no Rule named 'bus'$"):
        store.delete(sync_redis, "bus", "Rule")
    with pytest.raises(store.Ambiguous, match=r"^'twin' is both a Rule and a RuleEndpoint"):
        store.get(sync_redis, "twin")
    assert isinstance(store.get(sync_redis, "twin", "RuleEndpoint"), RuleEndpoint)
    assert isinstance(store.delete(sync_redis, "twin", "Rule"), Rule)


async def test_failures_keep_the_latest_errors_newest_first(
    sync_redis: redis.Redis, async_redis: aioredis.Redis
) -> None:
    now = [100.0]
    outcomes = Outcomes(async_redis, clock=lambda: now[0], keep_errors=3)
    for n in range(5):
        now[0] = 100.0 + n
        await outcomes.count("r", Outcome.FAIL, f"error {n}")
    await outcomes.count("r", Outcome.SUCCESS)
    status = store.rule_status(sync_redis, "r")
    assert (status.success, status.fail) == (1, 5)
    assert status.last_errors == [
        store.RecordedError(104.0, "error 4"),
        store.RecordedError(103.0, "error 3"),
        store.RecordedError(102.0, "error 2"),
    ]
    assert store.rule_status(sync_redis, "never-used") == store.RuleStatus("never-used", 0, 0, [])


async def test_a_thousand_concurrent_records_from_several_clients_count_exactly(redis_url: str) -> None:
    clients, per_client = 8, 125  # 1,000 successes and 1,000 failures

    async def record() -> None:
        conn = aioredis.Redis.from_url(redis_url)
        try:
            outcomes = Outcomes(conn)
            for n in range(per_client):
                await outcomes.count("busy", Outcome.SUCCESS)
                await outcomes.count("busy", Outcome.FAIL, f"e{n}")
        finally:
            await conn.aclose()

    await asyncio.gather(*(record() for _ in range(clients)))
    with redis.Redis.from_url(redis_url) as conn:
        status = store.rule_status(conn, "busy")
        assert (status.success, status.fail) == (1000, 1000)
        assert len(status.last_errors) == keys.LAST_ERRORS_KEPT


def test_concurrent_applies_of_clashing_rules_let_exactly_one_in(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as conn:
        store.apply(conn, load_files([EXAMPLES / "rest-to-eventbus.yaml"])[:2])
    clashing = [
        load_text(RULE_TEXT.format(path="/same").replace("my-rule", f"rule-{n}"), f"r{n}.yaml")
        for n in range(6)
    ]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(clashing))

    def apply(objects: list[Rule | RuleEndpoint]) -> None:
        with redis.Redis.from_url(redis_url) as conn:
            barrier.wait()
            try:
                store.apply(conn, objects)
                outcomes.append("applied")
            except ValidationError:
                outcomes.append("refused")

    workers = [threading.Thread(target=apply, args=(objects,)) for objects in clashing]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(outcomes) == ["applied"] + ["refused"] * 5
    with redis.Redis.from_url(redis_url) as conn:
        assert len(store.read_catalog(conn).rules) == 1
