"""What the router's two HTTP doors (the cloud REST ingress, the edge servicebus port) share."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from router.protocol import HttpAnswer

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]
JSON_TYPE = "application/json"
# The methods the router's doors take (any a REST client uses).
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Answer headers not passed back: the client already undid the content encoding, lengths are recomputed, and
# the server answering the caller sets its own date and name.
ANSWER_DROPPED = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)


class BodyTooLarge(Exception):
    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"request body too large: the limit is {limit_bytes} bytes")


def error_answer(status: int, error: str) -> HttpAnswer:
    """An error made here, carried back over the bus as an HTTP answer with a JSON body."""
    return HttpAnswer(status, [("content-type", JSON_TYPE)], json.dumps({"error": error}).encode())


def answer_too_large(what: str, size_bytes: int, limit_bytes: int) -> str | None:
    """Why an answer cannot be carried back (the bus refuses larger messages), or None when it can."""
    if size_bytes <= limit_bytes:
        return None
    return f"{what}: the answer ({size_bytes} bytes) is over the limit of {limit_bytes} bytes"


def redis_guarded(endpoint: Endpoint) -> Endpoint:
    """``endpoint``, answering 503 with a JSON error while this site's Redis cannot be reached: the message
    was not taken (one that Redis got just before may still go when it is back)."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (RedisError, OSError) as exc:
            log.warning("router: %s %s: redis failed: %s", request.method, request.url.path, exc)
            return json_error(503, f"this site's Redis cannot be reached: {exc}")

    return guarded


def json_error(status: int, message: str, **extra: object) -> Response:
    """An error the caller can read: ``{"error": message, ...}``."""
    return Response(json.dumps({"error": message, **extra}), status, media_type=JSON_TYPE)


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The request body, refused (:class:`BodyTooLarge`) from its Content-Length or as soon as more than
    ``limit_bytes`` arrived."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise BodyTooLarge(limit_bytes)
    chunks = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit_bytes:
            raise BodyTooLarge(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def answer_response(answer: HttpAnswer) -> Response:
    """An HTTP answer carried over the bus, as the response to give (every header kept, repeated ones too,
    except those describing the other hop's encoding: the body is already decoded)."""
    response = Response(answer.body, answer.status)
    for name, value in answer.headers:
        if name.lower() not in ANSWER_DROPPED:
            response.headers.append(name, value)
    return response


def join_url(base: str, suffix: str, query: str) -> str:
    """``base`` with the path ``suffix`` appended and ``query`` added to its query string."""
    url = base.rstrip("/") + suffix if suffix else base
    if query:
        url += ("&" if "?" in url else "?") + query
    return url
