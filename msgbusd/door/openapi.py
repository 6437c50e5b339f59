"""The OpenAPI document of a site's HTTP endpoints, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from msgbusd.sending.posts import BATCH_PATH, REMOTE_PATH, REPLY_PATH

ENVELOPE_FIELDS: dict[str, dict[str, Any]] = {
    "ver": {"type": "integer", "description": "protocol version, 1"},
    "uid": {"type": "string", "description": "the request's id at its destination, <dst>.<n>"},
    "cmd": {"type": "string", "description": "the command; served from the Redis list msgbus.<cmd>"},
    "exp": {"type": "integer", "description": "lifetime in seconds (0: 3600)"},
    "try": {"type": "integer", "description": "re-sends allowed after the first attempt"},
    "dat": {"type": "string", "description": "the payload, base64"},
    "src": {"type": "integer", "description": "the sending twin"},
    "dst": {"type": "array", "items": {"type": "integer"}, "description": "destination twins"},
    "ret": {"type": "string", "description": "where the reply goes"},
    "shm": {"type": "string", "description": "schema of the payload (free text)"},
    "now": {"type": "integer", "description": "send time, unix seconds; refused when older than 60 s"},
    "pxy": {"type": "boolean", "description": "sent through the proxy flow (/zbus-cmd)"},
    "err": {"type": "string", "description": "an error, in a reply"},
    "sig": {"type": "string", "description": "'e' or 's' (ed25519, sr25519) + hex signature of the fields"},
}

ERROR = {
    "type": "object",
    "properties": {"Status": {"const": "error"}, "Message": {"type": "string"}},
    "required": ["Status", "Message"],
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json({"$ref": "#/components/schemas/Error"}, description)


ENVELOPE_BODY = {
    "required": True,
    "description": "A signed envelope (JSON; any content type is accepted, as go-rmb does).",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Envelope"}}},
}
DOOR_ERRORS = {
    "400": _error(
        "refused: couldn't parse json, message is too old, source twin not found, or a signature problem"
    ),
    "413": _error("the body is over the site's --max-message-size (refused before it is read)"),
    "429": _error("the source twin is over its --rate-limit"),
    "502": _error("couldn't get the source twin's public key (the twin source did not answer)"),
    "503": _error(
        "couldn't queue the message: the site's Redis failed; Retry-After says when to send it again "
        "(that is no failed attempt)"
    ),
}
ACCEPTED = _json({"type": "object", "properties": {"status": {"const": "accepted"}}}, "accepted: queued once")
_NUMBER_OR_NULL = {"type": ["number", "null"]}
STATUS_PEER = {
    "type": "object",
    "properties": {
        "twin": {"type": "integer"},
        "state": {"enum": ["up", "down", "probing"], "description": "probing: not known yet, probed first"},
        "down_since": {**_NUMBER_OR_NULL, "description": "unix time, null when up"},
        "cause": {"type": "string", "description": "why it is down"},
        "probes": {"type": "integer", "description": "failed probes since it went down"},
        "next_probe_in_s": _NUMBER_OR_NULL,
        "last_sent_at": {**_NUMBER_OR_NULL, "description": "unix time it last took a message"},
        "last_error": {"type": "string"},
        "last_error_at": _NUMBER_OR_NULL,
    },
}
STATUS_UPLINK = {
    "type": "object",
    "properties": {
        "twin": {
            "type": ["integer", "null"],
            "description": "the twin at the other end (a relay's: null until it first answered)",
        },
        "direction": {
            "enum": ["out", "relay", "in"],
            "description": "out: kept by this site to that twin's (--uplink); relay: kept by this site to "
            "the relay its twin entry names; in: opened to this site by that twin (at a relay, the twins it "
            "relays)",
        },
        "relay": {"type": "string", "description": "the relay's address (host:port), for direction relay"},
        "open": {"type": "boolean"},
        "since": {
            **_NUMBER_OR_NULL,
            "description": "unix time it last opened or closed; null: not tried yet",
        },
    },
}
STATUS = {
    "type": "object",
    "properties": {
        "twin": {"type": "integer"},
        "version": {"type": "string"},
        "started_at": {"type": "number", "description": "unix time"},
        "uptime_s": {"type": "number"},
        "problems": {"type": "array", "items": {"type": "string"}, "description": "what /healthz reports"},
        "warnings": {
            "type": "array",
            "items": {"type": "string"},
            "description": "what the operator should act on though the bus works (an event log that cannot "
            "be written, a peer's clock off, a Redis that may evict keys); not failing /healthz",
        },
        "inflight": {"type": "integer"},
        "links_open": {"type": "integer"},
        "peers": {"type": "array", "items": STATUS_PEER},
        "uplinks": {"type": "array", "items": STATUS_UPLINK},
        "traffic": {
            "type": "object",
            "description": "the last minute (or since the start): messages to and from other sites per "
            "second, and local requests' round trips (acceptance to delivery of the reply)",
            "properties": {
                "window_s": {"type": "number"},
                "sent_per_s": {"type": "number"},
                "received_per_s": {"type": "number"},
                "round_trips": {"type": "integer"},
                "round_trips_per_s": {"type": "number"},
                "round_trip_p50_s": _NUMBER_OR_NULL,
                "round_trip_p99_s": _NUMBER_OR_NULL,
            },
        },
    },
}
LOCAL_ONLY = {"403": _error("only served to clients on this machine")}


def _any_method(operation: dict[str, Any]) -> dict[str, Any]:
    """The endpoints answer every method the same way; POST is the one senders use."""
    return {"post": operation}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "msgbus site",
            "version": "1",
            "description": "What a site serves on its port (8051): RMB's endpoints (the same answers as "
            'go-rmb) and msgbus\'s own. Errors are {"Status": "error", "Message": ...}.',
        },
        "paths": {
            REMOTE_PATH: _any_method(
                {
                    "summary": "A request from another site, for a service of this one",
                    "requestBody": ENVELOPE_BODY,
                    "responses": {"200": ACCEPTED, **DOOR_ERRORS},
                }
            ),
            REPLY_PATH: _any_method(
                {
                    "summary": "A reply to a request this site sent",
                    "requestBody": ENVELOPE_BODY,
                    "responses": {"200": ACCEPTED, **DOOR_ERRORS},
                }
            ),
            "/zbus-cmd": _any_method(
                {
                    "summary": "A request from an HTTP client without a site (proxy flow, pxy = true)",
                    "requestBody": ENVELOPE_BODY,
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"retqueue": {"type": "string", "format": "uuid"}},
                            },
                            "queued; poll /zbus-result with this retqueue",
                        ),
                        **DOOR_ERRORS,
                    },
                }
            ),
            "/zbus-result": _any_method(
                {
                    "summary": "The replies waiting for a proxy-flow client (not removed; they expire)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"retqueue": {"type": "string", "format": "uuid"}},
                                    "required": ["retqueue"],
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {"type": "array", "items": {"$ref": "#/components/schemas/Envelope"}},
                            "every reply so far, signed by this site, dat as text",
                        ),
                        "400": _error("couldn't parse json, or Invalid Retqueue, it should be a valid UUID"),
                        "413": DOOR_ERRORS["413"],
                    },
                }
            ),
            BATCH_PATH: _any_method(
                {
                    "summary": "Many envelopes in one POST, between msgbus sites; each checked and answered "
                    "on its own",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "messages": {
                                            "type": "array",
                                            "items": {
                                                "type": "object",
                                                "properties": {
                                                    "path": {"enum": [REMOTE_PATH, REPLY_PATH]},
                                                    "envelope": {"$ref": "#/components/schemas/Envelope"},
                                                },
                                                "required": ["path", "envelope"],
                                            },
                                        }
                                    },
                                    "required": ["messages"],
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "results": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "status": {"type": "integer"},
                                                "message": {"type": "string"},
                                            },
                                        },
                                    }
                                },
                            },
                            "one result per message, in order: status 200, or the error a single POST "
                            "would have got",
                        ),
                        "400": _error("couldn't parse json"),
                        "413": DOOR_ERRORS["413"],
                        "503": DOOR_ERRORS["503"],
                    },
                }
            ),
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (this machine only)",
                    "responses": {"200": {"description": "text exposition format"}, **LOCAL_ONLY},
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Redis reachable and every loop turning (this machine only)",
                    "responses": {
                        "200": _json({"type": "object"}, "healthy"),
                        "503": _json({"type": "object"}, "unhealthy, with the problems"),
                        **LOCAL_ONLY,
                    },
                }
            },
            "/status": {
                "get": {
                    "summary": "What msgbus status needs from the daemon: version, uptime, problems, each "
                    "peer's state and last error, the last minute's traffic (this machine only)",
                    "responses": {
                        "200": _json(STATUS, "the report"),
                        "503": _json({"type": "object"}, "the report timed out, with the problems"),
                        **LOCAL_ONLY,
                    },
                }
            },
            "/openapi.json": {
                "get": {"summary": "This document", "responses": {"200": _json({"type": "object"}, "")}}
            },
        },
        "components": {
            "schemas": {
                "Envelope": {"type": "object", "properties": ENVELOPE_FIELDS},
                "Error": ERROR,
            }
        },
    }
