"""Checks that need every object at once: what rules refer to, which kinds of rules exist, duplicates.

Resource keys by endpoint type (the router contract):

=========== ====================================== ============================
type        as a rule's source                      as a rule's target
=========== ====================================== ============================
rest        ``path`` (a path of the router)         ``resource`` (an http(s) URL)
eventbus    ``topic`` (filter), ``node_name``       ``topic``
servicebus  ``target_url``, ``node_name``           ``path`` (on the edge service)
=========== ====================================== ============================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from router.matching import compile_path, path_error, topic_filter_error, topic_name_error
from router.rules import (
    ENDPOINT,
    STORED,
    EndpointType,
    RouterObject,
    Rule,
    RuleEndpoint,
    canonical_json,
)

REST, EVENTBUS, SERVICEBUS = EndpointType.REST, EndpointType.EVENTBUS, EndpointType.SERVICEBUS

SOURCE_KEYS: Mapping[EndpointType, tuple[str, ...]] = {
    REST: ("path",),
    EVENTBUS: ("topic", "node_name"),
    SERVICEBUS: ("target_url", "node_name"),
}
TARGET_KEYS: Mapping[EndpointType, tuple[str, ...]] = {
    REST: ("resource",),
    EVENTBUS: ("topic",),
    SERVICEBUS: ("path",),
}
RULE_KINDS = frozenset({(REST, EVENTBUS), (EVENTBUS, REST), (REST, SERVICEBUS), (SERVICEBUS, REST)})


class ValidationError(ValueError):
    """Objects that cannot be applied; ``problems`` holds one line per problem, each naming where.

    ``str()`` is every problem on one line, separated by "; ".
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass
class Catalog:
    """Every endpoint and rule by name: what the store holds, or what it would hold after an apply."""

    endpoints: dict[str, RuleEndpoint] = field(default_factory=dict)
    rules: dict[str, Rule] = field(default_factory=dict)

    def get(self, kind: str, name: str) -> RouterObject | None:
        return self.endpoints.get(name) if kind == ENDPOINT else self.rules.get(name)

    def merged(self, objects: Iterable[RouterObject]) -> Catalog:
        """A new catalog with ``objects`` added, each replacing a stored one of the same kind and name."""
        result = Catalog(dict(self.endpoints), dict(self.rules))
        for obj in objects:
            if isinstance(obj, RuleEndpoint):
                result.endpoints[obj.name] = obj
            else:
                result.rules[obj.name] = obj
        return result

    def rules_using(self, endpoint: str) -> list[str]:
        return sorted(name for name, rule in self.rules.items() if endpoint in (rule.source, rule.target))


def rule_kind(rule: Rule, endpoints: Mapping[str, RuleEndpoint]) -> str:
    """``source->target`` types of a rule whose endpoints are known, e.g. ``rest->eventbus``."""
    return f"{endpoints[rule.source].type.value}->{endpoints[rule.target].type.value}"


def check_no_repeats(objects: Iterable[RouterObject]) -> None:
    """Refuse two different objects of the same kind and name in one apply (which would win is a guess).

    Identical copies are fine: KubeEdge examples repeat the same endpoints in every file.
    """
    seen: dict[tuple[str, str], RouterObject] = {}
    problems = []
    for obj in objects:
        first = seen.setdefault((obj.kind, obj.name), obj)
        if first is not obj and canonical_json(first) != canonical_json(obj):
            problems.append(
                f"{obj.origin}: metadata.name: a different {obj.kind} {obj.name!r} is in {first.origin}"
            )
    if problems:
        raise ValidationError(problems)


def validate(catalog: Catalog) -> None:
    """Raise ValidationError listing every problem of the catalog's rules."""
    problems: list[str] = []
    broken: set[str] = set()
    for rule in sorted(catalog.rules.values(), key=lambda rule: rule.name):
        own = _rule_problems(rule, catalog.endpoints)
        if own:
            broken.add(rule.name)
        problems.extend(f"{rule.origin}: {problem}" for problem in own)
    problems.extend(_duplicate_sources(catalog, skip=broken))
    if problems:
        raise ValidationError(problems)


def _rule_problems(rule: Rule, endpoints: Mapping[str, RuleEndpoint]) -> list[str]:
    problems = []
    source, target = endpoints.get(rule.source), endpoints.get(rule.target)
    if source is None:
        problems.append(f"spec.source: unknown RuleEndpoint {rule.source!r}")
    if target is None:
        problems.append(f"spec.target: unknown RuleEndpoint {rule.target!r}")
    if source is None or target is None:
        return problems
    if (source.type, target.type) not in RULE_KINDS:
        kinds = ", ".join(sorted(f"{s.value}->{t.value}" for s, t in RULE_KINDS))
        kind = f"{source.type.value}->{target.type.value}"
        return [f"spec: rule kind {kind} is not supported (only {kinds})"]
    problems.extend(
        _resource_problems("spec.sourceResource", rule.source_resource, SOURCE_KEYS[source.type], source)
    )
    problems.extend(
        _resource_problems("spec.targetResource", rule.target_resource, TARGET_KEYS[target.type], target)
    )
    if problems:
        return problems
    return [f"{where}: {why}" for where, why in _value_problems(rule, source.type, target.type)]


def _resource_problems(
    field_path: str, resource: Mapping[str, str], keys: tuple[str, ...], endpoint: RuleEndpoint
) -> list[str]:
    wanted = " and ".join(repr(key) for key in keys)
    why = f"a {endpoint.type.value} endpoint ({endpoint.name}) needs {wanted}"
    problems = [f"{field_path}.{key}: missing: {why}" for key in keys if not resource.get(key)]
    problems.extend(f"{field_path}.{key}: unexpected key: {why}" for key in resource if key not in keys)
    return problems


def _value_problems(rule: Rule, source: EndpointType, target: EndpointType) -> list[tuple[str, str]]:
    problems: list[tuple[str, str | None]] = []
    src, dst = rule.source_resource, rule.target_resource
    if source is REST:
        problems.append(("spec.sourceResource.path", path_error(src["path"])))
    if source is EVENTBUS:
        problems.append(("spec.sourceResource.topic", topic_filter_error(src["topic"])))
    if source is SERVICEBUS:
        problems.append(("spec.sourceResource.target_url", _url_error(src["target_url"])))
    if target is REST:
        problems.append(("spec.targetResource.resource", _url_error(dst["resource"])))
    if target is EVENTBUS:
        problems.append(("spec.targetResource.topic", topic_name_error(dst["topic"])))
    if target is SERVICEBUS:
        path = dst["path"]
        problems.append(("spec.targetResource.path", None if path.startswith("/") else _no_slash(path)))
    return [(where, why) for where, why in problems if why is not None]


def _no_slash(path: str) -> str:
    return f"must start with '/', got {path!r}"


def _url_error(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http:// or https:// URL, got {url!r}"
    return None


def _duplicate_sources(catalog: Catalog, skip: set[str]) -> list[str]:
    """Two rules that would take the same messages: identical anchored REST patterns in one namespace, or
    the same eventbus topic on the same node."""
    problems = []
    claimed: dict[tuple[object, ...], Rule] = {}
    # Stored rules claim first, so that a conflict is reported on the new rule that causes it.
    for rule in sorted(
        catalog.rules.values(), key=lambda rule: (not rule.origin.startswith(STORED), rule.name)
    ):
        source = catalog.endpoints.get(rule.source)
        key: tuple[object, ...] | None = None
        if source is None or rule.name in skip:
            continue
        if source.type is REST and path_error(rule.source_resource.get("path", "")) is None:
            key = (REST, rule.namespace, compile_path(rule.source_resource["path"]).shape)
            what = f"source path {rule.source_resource['path']!r}"
        elif source.type is EVENTBUS and "topic" in rule.source_resource:
            node = rule.source_resource.get("node_name")
            key = (EVENTBUS, rule.namespace, rule.source_resource["topic"], node)
            what = f"topic {rule.source_resource['topic']!r} on node {node!r}"
        if key is None:
            continue
        other = claimed.setdefault(key, rule)
        if other is not rule:
            problems.append(
                f"{rule.origin}: spec.sourceResource: {what} is already used by rule {other.name!r}"
            )
    return problems
