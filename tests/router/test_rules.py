"""Rules and RuleEndpoints: KubeEdge files load unchanged, and every mistake is named by file, document
and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.loading import load_files, load_text
from router.rules import DocumentError, EndpointType, Rule, RuleEndpoint, canonical_json
from router.validation import Catalog, ValidationError, check_no_repeats, rule_kind, validate

EXAMPLES = Path(__file__).parent / "examples"
INVALID = EXAMPLES / "invalid"


def catalog_of(*paths: Path) -> Catalog:
    objects = load_files(paths)
    check_no_repeats(objects)
    return Catalog().merged(objects)


def test_the_rest_to_eventbus_example_loads_unchanged() -> None:
    objects = load_files([EXAMPLES / "rest-to-eventbus.yaml"])
    assert objects == [
        RuleEndpoint("my-rest", EndpointType.REST, {}, labels={"description": "test"}),
        RuleEndpoint("my-eventbus", EndpointType.EVENTBUS, {}, labels={"description": "test"}),
        Rule(
            "my-rule",
            source="my-rest",
            source_resource={"path": "/a"},
            target="my-eventbus",
            target_resource={"topic": "test"},
            labels={"description": "test"},
        ),
    ]
    catalog = catalog_of(EXAMPLES / "rest-to-eventbus.yaml")
    validate(catalog)
    assert rule_kind(catalog.rules["my-rule"], catalog.endpoints) == "rest->eventbus"


def test_the_eventbus_to_rest_example_loads_unchanged() -> None:
    catalog = catalog_of(EXAMPLES / "eventbus-to-rest.yaml")
    validate(catalog)
    rule = catalog.rules["my-rule-eventbus-rest"]
    assert rule_kind(rule, catalog.endpoints) == "eventbus->rest"
    assert rule.source_resource == {"topic": "test", "node_name": "edge-node-1"}
    assert rule.target_resource == {"resource": "http://127.0.0.1:8080/test"}


def test_the_servicebus_example_loads_unchanged_with_its_port() -> None:
    catalog = catalog_of(EXAMPLES / "rest-to-servicebus.yaml")
    validate(catalog)
    assert catalog.endpoints["my-servicebus"].service_port == 6666
    kinds = {name: rule_kind(rule, catalog.endpoints) for name, rule in catalog.rules.items()}
    assert kinds == {
        "my-rule-rest-servicebus": "rest->servicebus",
        "my-rule-servicebus-rest": "servicebus->rest",
    }


def test_eventbus_examples_go_together_but_two_rest_rules_on_one_path_do_not() -> None:
    validate(catalog_of(EXAMPLES / "rest-to-eventbus.yaml", EXAMPLES / "eventbus-to-rest.yaml"))
    with pytest.raises(ValidationError) as caught:
        validate(catalog_of(EXAMPLES / "rest-to-eventbus.yaml", EXAMPLES / "rest-to-servicebus.yaml"))
    assert caught.value.problems == [
        f"{EXAMPLES / 'rest-to-servicebus.yaml'}, document 3 (Rule my-rule-rest-servicebus): "
        "spec.sourceResource: source path '/a' is already used by rule 'my-rule'"
    ]


def test_api_is_the_old_name_of_rest_and_an_unquoted_port_is_taken() -> None:
    text = """
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: old}
spec: {ruleEndpointType: api}
---
apiVersion: rules.kubeedge.io/v1
kind: RuleEndpoint
metadata: {name: svc, namespace: plant-3}
spec: {ruleEndpointType: servicebus, properties: {service_port: 8080}}
"""
    old, svc = load_text(text, "t.yaml")
    assert isinstance(old, RuleEndpoint) and old.type is EndpointType.REST
    assert isinstance(svc, RuleEndpoint) and svc.service_port == 8080 and svc.namespace == "plant-3"
    assert svc.to_document()["spec"]["properties"] == {"service_port": "8080"}


def test_the_stored_form_drops_kubeedge_status_and_is_stable() -> None:
    rule = load_files([EXAMPLES / "rest-to-eventbus.yaml"])[2]
    assert canonical_json(rule) == (
        '{"apiVersion":"rules.kubeedge.io/v1","kind":"Rule","metadata":{"labels":{"description":"test"},'
        '"name":"my-rule"},"spec":{"source":"my-rest","sourceResource":{"path":"/a"},"target":"my-eventbus",'
        '"targetResource":{"topic":"test"}}}'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list", "t.yaml, document 1: expected a mapping, got a list"),
        (
            "apiVersion: v1\nkind: Rule",
            "t.yaml, document 1: apiVersion: expected 'rules.kubeedge.io/v1', got 'v1'",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: Device",
            "t.yaml, document 1: kind: expected Rule or RuleEndpoint, got 'Device'",
        ),
        ("apiVersion: rules.kubeedge.io/v1\nkind: Rule\nspec: {}", "t.yaml, document 1: metadata: missing"),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: Rule\nmetadata: {name: ''}",
            "t.yaml, document 1: metadata.name: expected a non-empty name, got ''",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: Rule\nmetadata: {name: r}",
            "t.yaml, document 1 (Rule r): spec: missing",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: Rule\nmetadata: {name: r}\n"
            "spec: {source: a, target: b, targetResource: {}}",
            "t.yaml, document 1 (Rule r): spec.sourceResource: missing",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: Rule\nmetadata: {name: r}\n"
            "spec: {source: a, sourceResource: {path: [x]}, target: b, targetResource: {}}",
            "t.yaml, document 1 (Rule r): spec.sourceResource.path: expected a string, got a list",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata: {name: e}\n"
            "spec: {ruleEndpointType: kafka}",
            "t.yaml, document 1 (RuleEndpoint e): spec.ruleEndpointType: expected rest, eventbus or "
            "servicebus, "
            "got 'kafka'",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata: {name: e}\n"
            "spec: {ruleEndpointType: servicebus}",
            "t.yaml, document 1 (RuleEndpoint e): spec.properties.service_port: required for a "
            "servicebus endpoint",
        ),
        (
            "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata: {name: e}\n"
            "spec: {ruleEndpointType: servicebus, properties: {service_port: '0'}}",
            "t.yaml, document 1 (RuleEndpoint e): spec.properties.service_port: expected a port "
            "number 1-65535, "
            "got '0'",
        ),
        ("a: [1", "t.yaml: invalid YAML: line 1, column 6: expected ',' or ']', but got '<stream end>'"),
    ],
)
def test_a_bad_document_is_named_with_its_field(text: str, message: str) -> None:
    with pytest.raises(DocumentError) as caught:
        load_text(text, "t.yaml")
    assert str(caught.value) == message


def test_documents_are_counted_from_one_including_empty_ones() -> None:
    text = "---\n---\napiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata: {name: e}\nspec: {}\n"
    with pytest.raises(
        DocumentError, match=r"^t.yaml, document 2 \(RuleEndpoint e\): spec.ruleEndpointType: "
    ):
        load_text(text, "t.yaml")


@pytest.mark.parametrize(
    ("file", "problems"),
    [
        (
            "unknown-endpoint.yaml",
            ["document 2 (Rule to-nowhere): spec.target: unknown RuleEndpoint 'my-eventbus'"],
        ),
        (
            "wrong-resource-keys.yaml",
            [
                "document 3 (Rule topic-for-a-url): spec.targetResource.resource: missing: a rest "
                "endpoint (my-rest) "
                "needs 'resource'",
                "document 3 (Rule topic-for-a-url): spec.targetResource.topic: unexpected key: a "
                "rest endpoint "
                "(my-rest) needs 'resource'",
            ],
        ),
        (
            "unsupported-kind.yaml",
            [
                "document 3 (Rule mqtt-to-edge-http): spec: rule kind eventbus->servicebus is not "
                "supported (only "
                "eventbus->rest, rest->eventbus, rest->servicebus, servicebus->rest)"
            ],
        ),
        (
            "duplicate-path.yaml",
            [
                "document 4 (Rule devices-by-name): spec.sourceResource: source path "
                "'/devices/{name}/' is already "
                "used by rule 'devices-by-id'"
            ],
        ),
        (
            "duplicate-topic.yaml",
            [
                "document 4 (Rule second): spec.sourceResource: topic 'sensors/+' on node "
                "'edge-node-1' is already "
                "used by rule 'first'"
            ],
        ),
        (
            "path-without-slash.yaml",
            ["document 3 (Rule relative): spec.sourceResource.path: must start with '/', got 'a/b'"],
        ),
    ],
)
def test_invalid_examples_are_refused_with_every_problem_named(file: str, problems: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        validate(catalog_of(INVALID / file))
    assert caught.value.problems == [
        f"{INVALID / file}, document {p.removeprefix('document ')}" for p in problems
    ]


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("bad-service-port.yaml", "document 2 (RuleEndpoint my-servicebus): spec.properties.service_port: "),
        ("missing-target.yaml", "document 2 (Rule half-a-rule): spec.target: missing"),
        ("not-yaml.yaml", "invalid YAML: line 4, column 1: "),
    ],
)
def test_invalid_example_documents_are_refused_on_load(file: str, message: str) -> None:
    with pytest.raises(DocumentError) as caught:
        load_files([INVALID / file])
    assert message in str(caught.value)
    assert str(caught.value).startswith(str(INVALID / file))


def rule(
    name: str, source: str, source_resource: dict[str, str], target: str, target_resource: dict[str, str]
) -> Rule:
    return Rule(name, source, source_resource, target, target_resource, origin=f"rule {name}")


ENDPOINTS = {
    "rest": RuleEndpoint("rest", EndpointType.REST),
    "bus": RuleEndpoint("bus", EndpointType.EVENTBUS),
    "svc": RuleEndpoint("svc", EndpointType.SERVICEBUS, {"service_port": "6666"}),
}


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (
            rule("r", "rest", {"path": "/a/{x}/{x}"}, "bus", {"topic": "t"}),
            "spec.sourceResource.path: variable {x} appears twice",
        ),
        (
            rule("r", "rest", {"path": "/a/x{y}"}, "bus", {"topic": "t"}),
            "spec.sourceResource.path: a variable must be a whole segment like {name}, got 'x{y}'",
        ),
        (
            rule("r", "rest", {"path": "/a"}, "bus", {"topic": "t/#"}),
            "spec.targetResource.topic: a topic to publish to cannot hold the wildcards '+' or '#', "
            "got 't/#'",
        ),
        (
            rule("r", "bus", {"topic": "a/#/b", "node_name": "n"}, "rest", {"resource": "http://h/x"}),
            "spec.sourceResource.topic: '#' must be a whole level and the last one, got 'a/#/b'",
        ),
        (
            rule("r", "bus", {"topic": "t", "node_name": "n"}, "rest", {"resource": "ftp://h/x"}),
            "spec.targetResource.resource: expected an http:// or https:// URL, got 'ftp://h/x'",
        ),
        (
            rule("r", "rest", {"path": "/a"}, "svc", {"path": "b"}),
            "spec.targetResource.path: must start with '/', got 'b'",
        ),
        (
            rule("r", "svc", {"target_url": "http://h/x"}, "rest", {"resource": "http://h/x"}),
            "spec.sourceResource.node_name: missing: a servicebus endpoint (svc) needs 'target_url' "
            "and 'node_name'",
        ),
        (
            rule("r", "rest", {"path": "/a"}, "rest", {"resource": "http://h/x"}),
            "spec: rule kind rest->rest is not supported (only eventbus->rest, rest->eventbus, "
            "rest->servicebus, "
            "servicebus->rest)",
        ),
    ],
)
def test_resource_values_are_checked(bad: Rule, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate(Catalog(dict(ENDPOINTS), {"r": bad}))
    assert caught.value.problems == [f"rule r: {problem}"]


def test_same_path_in_another_namespace_or_topic_on_another_node_is_fine() -> None:
    rules = {
        "a": rule("a", "rest", {"path": "/a"}, "bus", {"topic": "t"}),
        "b": Rule("b", "rest", {"path": "/a"}, "bus", {"topic": "t"}, namespace="other"),
        "c": rule("c", "bus", {"topic": "t", "node_name": "n1"}, "rest", {"resource": "http://h/x"}),
        "d": rule("d", "bus", {"topic": "t", "node_name": "n2"}, "rest", {"resource": "http://h/x"}),
        "e": rule("e", "rest", {"path": "/a/b"}, "svc", {"path": "/b"}),
    }
    validate(Catalog(dict(ENDPOINTS), rules))


def test_different_objects_with_one_name_in_one_apply_are_refused_identical_copies_are_not() -> None:
    first = RuleEndpoint("e", EndpointType.REST, origin="a.yaml, document 1 (RuleEndpoint e)")
    copy = RuleEndpoint("e", EndpointType.REST, origin="b.yaml, document 1 (RuleEndpoint e)")
    other = RuleEndpoint("e", EndpointType.EVENTBUS, origin="b.yaml, document 2 (RuleEndpoint e)")
    check_no_repeats([first, copy])
    with pytest.raises(ValidationError) as caught:
        check_no_repeats([first, copy, other])
    assert str(caught.value) == (
        "b.yaml, document 2 (RuleEndpoint e): metadata.name: a different RuleEndpoint 'e' is in "
        "a.yaml, document 1 (RuleEndpoint e)"
    )
