"""Rules and RuleEndpoints: the model, and reading one KubeEdge document into it.

A document is what one ``---`` section of a KubeEdge YAML file holds (``apiVersion: rules.kubeedge.io/v1``,
``kind: Rule`` or ``RuleEndpoint``, ``metadata.name``, ``spec``). Only the document's own shape is checked
here; whether its rule refers to known endpoints with the right resource keys is ``validation``'s job, since
that needs every object at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

API_VERSION = "rules.kubeedge.io/v1"
RULE = "Rule"
ENDPOINT = "RuleEndpoint"
KINDS = (RULE, ENDPOINT)
DEFAULT_NAMESPACE = "default"
# How objects read back from the store are named in errors (a file's objects are named by file and index).
STORED = "stored"


class EndpointType(StrEnum):
    """Where messages come from or go to."""

    REST = "rest"  # an HTTP API in the cloud (source: a path of the router; target: a URL to POST to)
    EVENTBUS = "eventbus"  # the MQTT broker of an edge node
    SERVICEBUS = "servicebus"  # an HTTP service on an edge node, at 127.0.0.1:{service_port}


# Older KubeEdge files call a rest target "api" (the "eventbus->api" rule of its first release).
ENDPOINT_TYPE_ALIASES = {"api": EndpointType.REST}


class DocumentError(ValueError):
    """One document, or one field of it, is wrong; ``str()`` names the document and the field."""

    def __init__(self, origin: str, field_path: str, reason: str) -> None:
        self.origin = origin
        self.field_path = field_path
        self.reason = reason
        where = f"{origin}: {field_path}" if field_path else origin
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class RuleEndpoint:
    """A RuleEndpoint: a named place of a given type; ``properties`` carry ``service_port`` for servicebus."""

    name: str
    type: EndpointType
    properties: Mapping[str, str] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE
    labels: Mapping[str, str] = field(default_factory=dict)
    origin: str = field(default="", compare=False)

    kind = ENDPOINT

    @property
    def service_port(self) -> int | None:
        """The edge service's port of a servicebus endpoint (validated on load), else None."""
        port = self.properties.get("service_port")
        return int(port) if port is not None and port.isdigit() else None

    def to_document(self) -> dict[str, Any]:
        """The KubeEdge document of this endpoint (what ``get`` prints and the store keeps)."""
        return {
            "apiVersion": API_VERSION,
            "kind": ENDPOINT,
            "metadata": _metadata(self.name, self.namespace, self.labels),
            "spec": {"ruleEndpointType": self.type.value, "properties": dict(self.properties)},
        }


@dataclass(frozen=True)
class Rule:
    """A Rule: messages from ``source`` (an endpoint name) at ``source_resource`` go to ``target``."""

    name: str
    source: str
    source_resource: Mapping[str, str]
    target: str
    target_resource: Mapping[str, str]
    namespace: str = DEFAULT_NAMESPACE
    labels: Mapping[str, str] = field(default_factory=dict)
    origin: str = field(default="", compare=False)

    kind = RULE

    def to_document(self) -> dict[str, Any]:
        """The KubeEdge document of this rule, without KubeEdge's ``status`` (counters live apart)."""
        return {
            "apiVersion": API_VERSION,
            "kind": RULE,
            "metadata": _metadata(self.name, self.namespace, self.labels),
            "spec": {
                "source": self.source,
                "sourceResource": dict(self.source_resource),
                "target": self.target,
                "targetResource": dict(self.target_resource),
            },
        }


RouterObject = Rule | RuleEndpoint


def canonical_json(obj: RouterObject) -> str:
    """The stored form: the document as compact JSON with sorted keys, so equal objects compare equal."""
    return json.dumps(obj.to_document(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_document(doc: object, origin: str) -> RouterObject:
    """One KubeEdge document (already parsed from YAML or JSON) as a Rule or RuleEndpoint.

    Raises DocumentError naming ``origin`` and the field. A KubeEdge ``status`` section is accepted and
    ignored: the counters are kept by the store.
    """
    if not isinstance(doc, Mapping):
        raise DocumentError(origin, "", f"expected a mapping, got {_type_name(doc)}")
    api_version = doc.get("apiVersion")
    if api_version != API_VERSION:
        raise DocumentError(origin, "apiVersion", f"expected {API_VERSION!r}, got {api_version!r}")
    kind = doc.get("kind")
    if kind not in KINDS:
        raise DocumentError(origin, "kind", f"expected Rule or RuleEndpoint, got {kind!r}")
    metadata = _mapping(doc, "metadata", origin)
    name = metadata.get("name")
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise DocumentError(origin, "metadata.name", f"expected a non-empty name, got {name!r}")
    origin = f"{origin} ({kind} {name})"
    namespace = metadata.get("namespace", DEFAULT_NAMESPACE)
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise DocumentError(origin, "metadata.namespace", f"expected a namespace name, got {namespace!r}")
    labels = _string_map(metadata.get("labels", {}), "metadata.labels", origin)
    spec = _mapping(doc, "spec", origin)
    if kind == ENDPOINT:
        return _parse_endpoint(spec, name, namespace, labels, origin)
    return Rule(
        name=name,
        source=_string(spec, "source", origin),
        source_resource=_string_map(_required(spec, "sourceResource", origin), "spec.sourceResource", origin),
        target=_string(spec, "target", origin),
        target_resource=_string_map(_required(spec, "targetResource", origin), "spec.targetResource", origin),
        namespace=namespace,
        labels=labels,
        origin=origin,
    )


def _parse_endpoint(
    spec: Mapping[str, Any], name: str, namespace: str, labels: dict[str, str], origin: str
) -> RuleEndpoint:
    type_name = _string(spec, "ruleEndpointType", origin)
    try:
        endpoint_type = ENDPOINT_TYPE_ALIASES.get(type_name) or EndpointType(type_name)
    except ValueError:
        raise DocumentError(
            origin, "spec.ruleEndpointType", f"expected rest, eventbus or servicebus, got {type_name!r}"
        ) from None
    properties = _string_map(spec.get("properties") or {}, "spec.properties", origin)
    if endpoint_type is EndpointType.SERVICEBUS:
        port = properties.get("service_port")
        if port is None:
            raise DocumentError(origin, "spec.properties.service_port", "required for a servicebus endpoint")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise DocumentError(
                origin, "spec.properties.service_port", f"expected a port number 1-65535, got {port!r}"
            )
    return RuleEndpoint(name, endpoint_type, properties, namespace, labels, origin)


def _required(spec: Mapping[str, Any], key: str, origin: str) -> Any:
    if key not in spec or spec[key] is None:
        raise DocumentError(origin, f"spec.{key}", "missing")
    return spec[key]


def _string(spec: Mapping[str, Any], key: str, origin: str) -> str:
    value = _required(spec, key, origin)
    if not isinstance(value, str) or not value:
        raise DocumentError(origin, f"spec.{key}", f"expected a non-empty string, got {value!r}")
    return value


def _mapping(doc: Mapping[str, Any], key: str, origin: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None:
        raise DocumentError(origin, key, "missing")
    if not isinstance(value, Mapping):
        raise DocumentError(origin, key, f"expected a mapping, got {_type_name(value)}")
    return value


def _string_map(value: object, field_path: str, origin: str) -> dict[str, str]:
    """A map of strings (KubeEdge's ``additionalProperties: string``); YAML numbers such as an unquoted
    port are taken as their text, since writing ``service_port: 6666`` without quotes is an easy slip."""
    if not isinstance(value, Mapping):
        raise DocumentError(origin, field_path, f"expected a mapping, got {_type_name(value)}")
    result: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise DocumentError(origin, field_path, f"expected string keys, got {key!r}")
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise DocumentError(origin, f"{field_path}.{key}", f"expected a string, got {_type_name(item)}")
        result[key] = str(item)
    return result


def _metadata(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace != DEFAULT_NAMESPACE:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return metadata


def _type_name(value: object) -> str:
    if value is None:
        return "nothing"
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)
