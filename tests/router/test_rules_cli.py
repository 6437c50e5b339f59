"""`msgbus rules`, in process with typer's CliRunner against a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import yaml
from typer.testing import CliRunner

from client.cli import app
from router import keys
from router.outcomes import Outcome, Outcomes
from tests.support.servers import free_port

EXAMPLES = Path(__file__).parent / "examples"
REST_TO_EVENTBUS = str(EXAMPLES / "rest-to-eventbus.yaml")
EVENTBUS_TO_REST = str(EXAMPLES / "eventbus-to-rest.yaml")
SERVICEBUS = str(EXAMPLES / "rest-to-servicebus.yaml")

runner = CliRunner()


def rules(redis_url: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["rules", *args, "--redis", redis_url], input=stdin)
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def test_apply_prints_what_each_object_became(redis_url: str) -> None:
    code, out, _ = rules(redis_url, "apply", "-f", REST_TO_EVENTBUS, "-f", EVENTBUS_TO_REST)
    assert code == 0
    assert out.splitlines() == [
        "RuleEndpoint my-rest created",
        "RuleEndpoint my-eventbus created",
        "Rule my-rule created",
        "Rule my-rule-eventbus-rest created",
    ]
    edited = Path(REST_TO_EVENTBUS).read_text().replace('{"topic":"test"}', '{"topic":"other"}')
    code, out, _ = rules(redis_url, "apply", "-f", "-", stdin=edited)
    assert code == 0
    assert out.splitlines() == [
        "RuleEndpoint my-rest unchanged",
        "RuleEndpoint my-eventbus unchanged",
        "Rule my-rule replaced",
    ]


def test_list_shows_rules_and_endpoints_as_tables(redis_url: str) -> None:
    assert rules(redis_url, "list")[1] == "no rules\n\nno endpoints\n"
    rules(redis_url, "apply", "-f", SERVICEBUS)
    code, out, _ = rules(redis_url, "list")
    assert code == 0
    assert out.splitlines() == [
        "RULE                     KIND              SOURCE" + " " * 71 + "TARGET",
        "my-rule-rest-servicebus  rest->servicebus  my-rest path=/a" + " " * 62 + "my-servicebus path=/b",
        "my-rule-servicebus-rest  servicebus->rest  "
        "my-servicebus node_name=edge-node-1 target_url=http://127.0.0.1:8080/report  "
        "my-rest resource=http://127.0.0.1:8080/report",
        "",
        "ENDPOINT       TYPE        PROPERTIES         RULES",
        "my-rest        rest        -                  2",
        "my-servicebus  servicebus  service_port=6666  2",
    ]


def test_get_prints_a_document_that_applies_again(redis_url: str, tmp_path: Path) -> None:
    rules(redis_url, "apply", "-f", SERVICEBUS)
    code, out, _ = rules(redis_url, "get", "my-servicebus")
    assert code == 0
    assert yaml.safe_load(out) == {
        "apiVersion": "rules.kubeedge.io/v1",
        "kind": "RuleEndpoint",
        "metadata": {"name": "my-servicebus", "labels": {"description": "test"}},
        "spec": {"ruleEndpointType": "servicebus", "properties": {"service_port": "6666"}},
    }
    code, out, _ = rules(redis_url, "get", "my-rule-rest-servicebus", "-o", "json")
    assert json.loads(out)["spec"] == {
        "source": "my-rest",
        "sourceResource": {"path": "/a"},
        "target": "my-servicebus",
        "targetResource": {"path": "/b"},
    }
    saved = tmp_path / "again.yaml"
    saved.write_text(rules(redis_url, "get", "my-rule-rest-servicebus")[1])
    assert rules(redis_url, "apply", "-f", str(saved))[1] == "Rule my-rule-rest-servicebus unchanged\n"


def test_delete_refuses_an_endpoint_in_use(redis_url: str) -> None:
    rules(redis_url, "apply", "-f", REST_TO_EVENTBUS)
    code, _, err = rules(redis_url, "delete", "my-rest")
    assert (code, err) == (1, "error: RuleEndpoint 'my-rest' is used by rules: my-rule\n")
    assert rules(redis_url, "delete", "my-rule", "--kind", "rule")[:2] == (0, "Rule my-rule deleted\n")
    assert rules(redis_url, "delete", "my-rest", "--kind", "endpoint")[:2] == (
        0,
        "RuleEndpoint my-rest deleted\n",
    )
    code, _, err = rules(redis_url, "delete", "my-rest")
    assert (code, err) == (1, "error: no Rule or RuleEndpoint named 'my-rest'\n")


async def test_status_shows_counters_and_latest_errors(
    redis_url: str, sync_redis: redis.Redis, async_redis: aioredis.Redis
) -> None:
    rules(redis_url, "apply", "-f", REST_TO_EVENTBUS, "-f", EVENTBUS_TO_REST)
    now = [1_700_000_000.0]
    outcomes = Outcomes(async_redis, clock=lambda: now[0])
    for _ in range(3):
        await outcomes.count("my-rule", Outcome.SUCCESS)
    await outcomes.count("my-rule", Outcome.FAIL, "edge node offline")
    now[0] = 1_700_000_060.0
    await outcomes.count("my-rule", Outcome.FAIL, "504 from the edge service")
    sync_redis.hincrby(keys.counters("my-rule"), "superseded", 4)
    sync_redis.hincrby(keys.counters("my-rule"), "retries", 5)
    code, out, _ = rules(redis_url, "status")
    assert code == 0
    assert out.splitlines() == [
        "RULE                   SUCCESS  FAIL  SUPERSEDED  RETRIES  LAST ERROR",
        "my-rule                3        2     4           5        504 from the edge service",
        "my-rule-eventbus-rest  0        0     0           0        -",
    ]
    code, out, _ = rules(redis_url, "status", "my-rule")
    assert out.splitlines() == [
        "rule:       my-rule",
        "success:    3",
        "fail:       2",
        "superseded: 4",
        "retries:    5",
        "last errors:",
        "  2023-11-14T22:14:20+00:00  504 from the edge service",
        "  2023-11-14T22:13:20+00:00  edge node offline",
    ]
    code, _, err = rules(redis_url, "status", "my-rest")
    assert (code, err) == (1, "error: no Rule named 'my-rest'\n")


@pytest.mark.parametrize(
    ("file", "message"),
    [
        (
            "unknown-endpoint.yaml",
            "document 2 (Rule to-nowhere): spec.target: unknown RuleEndpoint 'my-eventbus'",
        ),
        ("bad-service-port.yaml", "document 2 (RuleEndpoint my-servicebus): spec.properties.service_port: "),
        ("not-yaml.yaml", ": invalid YAML: line 4, column 1: "),
        ("unsupported-kind.yaml", "spec: rule kind eventbus->servicebus is not supported"),
    ],
)
def test_an_invalid_file_is_one_line_and_exit_2(redis_url: str, file: str, message: str) -> None:
    path = str(EXAMPLES / "invalid" / file)
    code, out, err = rules(redis_url, "apply", "-f", path)
    assert code == 2
    assert out == ""
    assert err.startswith(f"error: {path}") and message in err
    assert err.count("\n") == 1
    assert rules(redis_url, "list")[1] == "no rules\n\nno endpoints\n"


def test_a_good_file_is_not_applied_with_a_bad_one(redis_url: str) -> None:
    bad = EXAMPLES / "invalid" / "duplicate-topic.yaml"
    code, out, err = rules(redis_url, "apply", "-f", EVENTBUS_TO_REST, "-f", str(bad))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {bad}, document 1 (RuleEndpoint my-rest): metadata.name: a different ")
    assert rules(redis_url, "list")[1] == "no rules\n\nno endpoints\n"


def test_a_missing_file_is_exit_2(redis_url: str, tmp_path: Path) -> None:
    code, _, err = rules(redis_url, "apply", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err.startswith(f"error: {tmp_path / 'nope.yaml'}: cannot read: ")


def test_unreachable_redis_is_a_one_line_error_and_exit_3() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, _, err = rules(url, "list")
    assert code == 3
    assert err.startswith(f"error: cannot connect to Redis at {url}: ")
    assert err.count("\n") == 1
