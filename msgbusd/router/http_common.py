"""What the router's two HTTP doors (the cloud REST ingress, the edge servicebus port) share."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from msgbusd.router.protocol import HttpAnswer

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


@dataclass(frozen=True)
class HttpReply:
    """What an HTTP request got: the status, every header (repeated ones too) and the decoded body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class HttpFailed(Exception):
    """An HTTP request that got no answer; ``timed_out`` tells a timeout from a connection that failed."""

    def __init__(self, reason: str, *, timed_out: bool) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class HttpClients:
    """HTTP requests to cloud URLs and edge services, over keep-alive connections (at most
    ``per_origin`` to one origin, the other requests wait their turn).

    aiohttp, whose HTTP parser is compiled: one request costs about a fifth of the CPU it takes with httpx
    here (0.14-0.21 ms against 0.7-3.5 ms, measured with bench.http_sink), which is what eventbus->rest
    spends most of its time on: one POST per message.
    """

    def __init__(self, timeout_s: float, per_origin: int = 64) -> None:
        self._timeout_s = timeout_s
        self._per_origin = per_origin
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        content: bytes = b"",
        timeout_s: float | None = None,
    ) -> HttpReply:
        """Make one request; raises :class:`HttpFailed` when no answer came."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._per_origin)
            self._session = aiohttp.ClientSession(connector=connector)
            # aiohttp sends a GET, PUT or DELETE again on its own when the connection drops before the
            # answer; the router says what happened instead (a call must not run twice behind its back).
            # There is no public switch for it.
            self._session._retry_connection = False
        timeout = timeout_s if timeout_s is not None else self._timeout_s
        try:
            async with self._session.request(
                method,
                url,
                headers=list(headers),
                data=content,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                body = await response.read()
                return HttpReply(response.status, list(response.headers.items()), body)
        except TimeoutError:
            raise HttpFailed(f"no answer within {timeout:g}s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise HttpFailed(str(exc) or type(exc).__name__, timed_out=False) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
