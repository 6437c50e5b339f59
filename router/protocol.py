"""What the cloud and edge routers say to each other over the bus: commands, queues and message frames.

Every routed message is an ordinary RMB request between the two sites, so it is persisted, retried until
it expires and de-duplicated by the receiving site like any other. Its payload is a *frame*: a JSON header
(one line) followed by the raw body bytes, so bodies of any content travel without being re-encoded.

=====================  ===========  ==================================================================
command                served by    what
=====================  ===========  ==================================================================
router.edge.publish    edge         rest->eventbus: publish the body to the rule's topic (QoS 1)
router.edge.call       edge         rest->servicebus: make the HTTP call to the edge service
router.cloud.deliver   cloud        eventbus->rest: POST the body to the rule's URL until 2xx
router.cloud.forward   cloud        servicebus->rest: make the HTTP call to the rule's URL
router.cloud.rules     cloud        an edge asks for the rules that concern it
=====================  ===========  ==================================================================

The command queues (``msgbus.router.edge.*``, ``msgbus.router.cloud.*``) do not clash with the catalog's
keys in :mod:`router.keys`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PUBLISH = "router.edge.publish"
CALL = "router.edge.call"
DELIVER = "router.cloud.deliver"
FORWARD = "router.cloud.forward"
RULES = "router.cloud.rules"
EDGE_COMMANDS = (PUBLISH, CALL)
CLOUD_COMMANDS = (DELIVER, FORWARD, RULES)

# Where replies to the routers' own requests come back (ordinary return lists of local clients).
CLOUD_REPLIES = "msgbus.router.cloud.replies"
EDGE_REPLIES = "msgbus.router.edge.replies"

# Header a REST caller may set to keep only the newest message per key while the edge is away.
KEY_HEADER = "x-msgbus-key"
# Header a REST caller may set to choose the lifetime (seconds) of a rest->eventbus message.
TTL_HEADER = "x-msgbus-ttl"
# Header given to the cloud URL of an eventbus->rest or servicebus->rest rule, as KubeEdge does.
NODE_NAME_HEADER = "NodeName"

# Tries a routed message may spend: its lifetime, not a count, decides when the bus gives up on it.
UNLIMITED_TRIES = 1_000_000

# Request headers not passed on: they describe one HTTP hop, not the message.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

Headers = list[tuple[str, str]]


class FrameError(ValueError):
    """A payload that is not a frame this version understands."""


def encode_frame(header: Mapping[str, Any], body: bytes = b"") -> bytes:
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" + body


def decode_frame(payload: bytes) -> tuple[dict[str, Any], bytes]:
    head, sep, body = payload.partition(b"\n")
    if not sep:
        raise FrameError("not a router frame: no header line")
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise FrameError(f"not a router frame: the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise FrameError("not a router frame: the header is not a JSON object")
    return header, body


def passed_headers(headers: Sequence[tuple[str, str]]) -> Headers:
    """The headers worth carrying to the other side (hop-by-hop ones dropped)."""
    return [(name, value) for name, value in headers if name.lower() not in HOP_HEADERS]


def header_list(value: object) -> Headers:
    """Headers read back from a frame; anything that is not a list of name/value pairs is dropped."""
    if not isinstance(value, list):
        return []
    return [
        (str(item[0]), str(item[1])) for item in value if isinstance(item, list | tuple) and len(item) == 2
    ]


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP response carried back over the bus."""

    status: int
    headers: Headers
    body: bytes

    def encode(self) -> bytes:
        return encode_frame({"status": self.status, "headers": self.headers}, self.body)

    @classmethod
    def decode(cls, payload: bytes) -> HttpAnswer:
        header, body = decode_frame(payload)
        status = header.get("status")
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise FrameError(f"not an HTTP answer: status {status!r}")
        return cls(status, header_list(header.get("headers")), body)


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request carried over the bus: ``rule`` decides where it goes, ``suffix`` is the path beyond
    the rule's, ``query`` the raw query string."""

    id: str
    rule: str
    version: int
    method: str
    suffix: str
    query: str
    headers: Headers
    body: bytes

    def encode(self) -> bytes:
        header = {
            "id": self.id,
            "rule": self.rule,
            "version": self.version,
            "method": self.method,
            "suffix": self.suffix,
            "query": self.query,
            "headers": self.headers,
        }
        return encode_frame(header, self.body)

    @classmethod
    def decode(cls, payload: bytes) -> HttpCall:
        header, body = decode_frame(payload)
        return cls(
            id=_text(header, "id"),
            rule=_text(header, "rule"),
            version=_int(header, "version"),
            method=_text(header, "method"),
            suffix=str(header.get("suffix") or ""),
            query=str(header.get("query") or ""),
            headers=header_list(header.get("headers")),
            body=body,
        )


@dataclass(frozen=True)
class Event:
    """A message for a topic (rest->eventbus) or from one (eventbus->rest)."""

    id: str
    rule: str
    version: int
    topic: str  # rest->eventbus: the suffix to append to the rule's topic; eventbus->rest: the topic
    body: bytes

    def encode(self) -> bytes:
        header = {"id": self.id, "rule": self.rule, "version": self.version, "topic": self.topic}
        return encode_frame(header, self.body)

    @classmethod
    def decode(cls, payload: bytes) -> Event:
        header, body = decode_frame(payload)
        return cls(
            _text(header, "id"),
            _text(header, "rule"),
            _int(header, "version"),
            str(header.get("topic") or ""),
            body,
        )


def _text(header: Mapping[str, Any], key: str) -> str:
    value = header.get(key)
    if not isinstance(value, str) or not value:
        raise FrameError(f"router frame: {key!r} must be a non-empty string, got {value!r}")
    return value


def _int(header: Mapping[str, Any], key: str) -> int:
    value = header.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(f"router frame: {key!r} must be an integer, got {value!r}")
    return value
