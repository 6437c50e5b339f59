"""The catalog as the routers use it: which rule a REST path, an MQTT topic or a servicebus call belongs to.

Pure: built from a :class:`~router.validation.Catalog` (already validated), no I/O.

- REST sources are served at ``/{node}/{path}`` and ``/{node}/{namespace}/{path}``: when the first segment
  after the node names a namespace that has a REST rule matching the rest of the path, that rule wins;
  otherwise the whole path is matched against the rules of the ``default`` namespace.
- eventbus sources: edge apps publish to ``{namespace}/{topic}`` (KubeEdge's convention), so that is the
  MQTT filter an edge subscribes to for the rule.
- servicebus sources: an edge app calls the path of the rule's ``target_url`` on the edge's servicebus port.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from router.matching import PathMatch, match_path, match_topic, split_path
from router.rules import DEFAULT_NAMESPACE, EndpointType, RouterObject, Rule, RuleEndpoint
from router.validation import Catalog

REST, EVENTBUS, SERVICEBUS = EndpointType.REST, EndpointType.EVENTBUS, EndpointType.SERVICEBUS


@dataclass(frozen=True)
class Route:
    rule: Rule
    source: RuleEndpoint
    target: RuleEndpoint

    @property
    def kind(self) -> tuple[EndpointType, EndpointType]:
        return (self.source.type, self.target.type)

    @property
    def node(self) -> str:
        """The node a rule with an edge source belongs to ("" for REST sources: any node)."""
        return self.rule.source_resource.get("node_name", "")

    @property
    def topic_filter(self) -> str:
        """eventbus source: the MQTT filter edge apps publish under."""
        return f"{self.rule.namespace}/{self.rule.source_resource['topic']}"

    @property
    def servicebus_path(self) -> str:
        """servicebus source: the path edge apps call on the servicebus port."""
        return urlsplit(self.rule.source_resource["target_url"]).path or "/"


class RouteTable:
    def __init__(self, catalog: Catalog, version: int) -> None:
        self.catalog = catalog
        self.version = version
        self.routes: dict[str, Route] = {}
        for rule in catalog.rules.values():
            source = catalog.endpoints.get(rule.source)
            target = catalog.endpoints.get(rule.target)
            if source is not None and target is not None:
                self.routes[rule.name] = Route(rule, source, target)
        self._rest: dict[str, dict[str, str]] = {}
        for route in self.routes.values():
            if route.source.type is REST:
                paths = self._rest.setdefault(route.rule.namespace, {})
                paths[route.rule.name] = route.rule.source_resource["path"]

    def route(self, rule: str) -> Route | None:
        return self.routes.get(rule)

    def rest(self, path: str) -> tuple[Route, PathMatch] | None:
        """The REST rule for ``path`` (what follows ``/{node}``)."""
        segments = split_path(path)
        if segments and segments[0] in self._rest:
            found = match_path(self._rest[segments[0]], "/" + "/".join(segments[1:]))
            if found is not None:
                return self.routes[found.rule], found
        found = match_path(self._rest.get(DEFAULT_NAMESPACE, {}), path)
        return None if found is None else (self.routes[found.rule], found)

    def topic(self, topic: str) -> list[Route]:
        """The eventbus->rest rules a message published on ``topic`` goes to, the most specific first."""
        filters = [(r.rule.name, r.topic_filter) for r in self.routes.values() if r.source.type is EVENTBUS]
        return [self.routes[name] for name in match_topic(filters, topic)]

    def subscriptions(self) -> list[str]:
        return sorted({r.topic_filter for r in self.routes.values() if r.source.type is EVENTBUS})

    def servicebus(self, path: str) -> tuple[Route, PathMatch] | None:
        """The servicebus->rest rule an edge app's call to ``path`` belongs to."""
        paths = {r.rule.name: r.servicebus_path for r in self.routes.values() if r.source.type is SERVICEBUS}
        found = match_path(paths, path)
        return None if found is None else (self.routes[found.rule], found)

    def for_node(self, node_of_rule: Iterable[str]) -> list[RouterObject]:
        """What an edge needs: the rules addressed to any node (REST sources), those named in
        ``node_of_rule`` (rules whose source node is that edge), and the endpoints they use."""
        wanted = set(node_of_rule)
        rules = [r for r in self.routes.values() if r.source.type is REST or r.rule.name in wanted]
        endpoints = {
            name: self.catalog.endpoints[name] for r in rules for name in (r.rule.source, r.rule.target)
        }
        return [
            *sorted(endpoints.values(), key=lambda e: e.name),
            *sorted((r.rule for r in rules), key=lambda r: r.name),
        ]
