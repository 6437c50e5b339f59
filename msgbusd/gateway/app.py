"""The gateway's HTTP face: RMB's proxy endpoints for HTTP clients that have no site of their own.

``POST /twin/{id}`` passes the client's signed envelope to that twin's ``/zbus-cmd`` and answers what the
node answers (``{"retqueue": "<uuid4>"}``); ``POST /twin/{id}/{retqueue}`` (or GET) asks its
``/zbus-result`` with ``{"retqueue": "<retqueue>"}`` and answers the node's JSON array. The gateway signs
nothing and checks no signature: the node does both.

Every error is ``{"status": "error", "message": "..."}``:

- 400: the node did not answer 200 (``failed to Submit the message: <status> (<node's Message>)``, or
  ``failed to send remote: ...`` from ``/zbus-result``, as rmb-proxy words them); a twin id that is not one
- 404: no such twin
- 413: a body larger than the limit (refused before it is read)
- 502: the twin source failed, the twin has no usable address, or its node cannot be reached
- 504: the node did not answer in time
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from msgbusd.reports.logs import about
from twin_resolver.address import peer_url
from twin_resolver.base import Resolver, ResolverError, TwinNotFound

log = logging.getLogger("msgbusd.gateway")

JSON_TYPE = "application/json"
SUBMIT_PATH = "/zbus-cmd"
RESULT_PATH = "/zbus-result"
MAX_TWIN_ID = 2**32 - 1
# How much of a node's non-JSON error body is quoted back to the client.
QUOTED_BODY_CHARS = 200

_Endpoint = Callable[[Request], Awaitable[Response]]


class GatewayError(Exception):
    """A request the gateway answers with an error: the HTTP status and the message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> JSONResponse:
    """The gateway's error answer, in rmb-proxy's shape."""
    return JSONResponse({"status": "error", "message": message}, status_code=status)


class Nodes:
    """Posts to twins' daemons: finds the twin's address, sends, turns failures into :class:`GatewayError`."""

    def __init__(self, http: httpx.AsyncClient, resolver: Resolver) -> None:
        self._http = http
        self._resolver = resolver

    async def post(self, twin_id: int, path: str, body: bytes) -> httpx.Response:
        """The node's answer to ``body`` POSTed at ``path``, whatever its status."""
        url = await self._url(twin_id, path)
        try:
            return await self._http.post(url, content=body, headers={"Content-Type": JSON_TYPE})
        except httpx.TimeoutException as exc:
            log.warning("twin %s at %s did not answer in time", twin_id, url, extra=about(twin=twin_id))
            raise GatewayError(504, f"twin {twin_id} at {url} did not answer in time") from exc
        except httpx.TransportError as exc:
            log.warning("cannot reach twin %s at %s: %s", twin_id, url, exc, extra=about(twin=twin_id))
            raise GatewayError(502, f"cannot reach twin {twin_id} at {url}: {_reason(exc)}") from exc

    async def _url(self, twin_id: int, path: str) -> str:
        try:
            twin = await self._resolver.get_twin(twin_id)
        except TwinNotFound as exc:
            raise GatewayError(404, f"twin {twin_id} not found") from exc
        except ResolverError as exc:
            log.warning("cannot look up twin %s: %s", twin_id, exc, extra=about(twin=twin_id))
            raise GatewayError(502, f"couldn't get twin {twin_id}: {exc}") from exc
        try:
            return peer_url(twin.address, path)
        except ValueError as exc:
            raise GatewayError(502, f"twin {twin_id} has no address the gateway can reach: {exc}") from exc


def create_gateway_app(
    nodes: Nodes, *, max_body_bytes: int, cors_origins: Sequence[str] = ("*",)
) -> Starlette:
    """The ASGI app. ``cors_origins`` are the browser origins allowed to call it (``*``: any)."""

    async def submit(request: Request) -> Response:
        twin_id = _twin_id(request)
        body = await read_limited_body(request, max_body_bytes)
        answer = await nodes.post(twin_id, SUBMIT_PATH, body)
        return _passed_through(answer, twin_id, "failed to Submit the message")

    async def result(request: Request) -> Response:
        twin_id = _twin_id(request)
        retqueue = request.path_params["retqueue"]
        answer = await nodes.post(twin_id, RESULT_PATH, json.dumps({"retqueue": retqueue}).encode())
        return _passed_through(answer, twin_id, "failed to send remote")

    routes = [
        Route("/twin/{twin_id}", _answering_errors(submit), methods=["POST"]),
        Route("/twin/{twin_id}/{retqueue}", _answering_errors(result), methods=["GET", "POST"]),
    ]
    cors = Middleware(
        CORSMiddleware,
        allow_origins=list(cors_origins),
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["*"],
        max_age=600,
    )
    return Starlette(routes=routes, middleware=[cors])


async def read_limited_body(request: Request, max_bytes: int) -> bytes:
    """The request body; :class:`GatewayError` 413 as soon as it is known to exceed ``max_bytes``."""
    too_large = GatewayError(413, f"request body larger than {max_bytes} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def node_error_message(answer: httpx.Response) -> str:
    """The ``Message`` of a node's ``{"Status":"error","Message":...}`` body (any case), else its text."""
    try:
        body = json.loads(answer.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key, value in body.items():
            if key.lower() == "message":
                return str(value)
    text = answer.content.decode("utf-8", errors="replace").strip()
    return text[:QUOTED_BODY_CHARS] if text else "empty body"


def _passed_through(answer: httpx.Response, twin_id: int, failure: str) -> Response:
    path = answer.request.url.path
    if answer.status_code != 200:
        status = f"{answer.status_code} {answer.reason_phrase}".strip()
        message = f"{failure}: {status} ({node_error_message(answer)})"
        log.info("twin %s refused a request to %s: %s", twin_id, path, message, extra=about(twin=twin_id))
        return error_response(400, message)
    log.debug("twin %s answered %s", twin_id, path, extra=about(twin=twin_id))
    return Response(answer.content, 200, media_type=JSON_TYPE)


def _twin_id(request: Request) -> int:
    text = request.path_params["twin_id"]
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_TWIN_ID:
        raise GatewayError(400, f"invalid twin id {text!r}")
    return int(text)


def _answering_errors(endpoint: _Endpoint) -> _Endpoint:
    async def answered(request: Request) -> Response:
        try:
            return await endpoint(request)
        except GatewayError as exc:
            return error_response(exc.status, exc.message)
        except Exception:
            # Answered here rather than by starlette so that the client still gets JSON and CORS headers.
            log.exception("unexpected failure answering %s %s", request.method, request.url.path)
            return error_response(500, "internal error in the gateway; see its log")

    return answered


def _reason(exc: httpx.TransportError) -> str:
    return str(exc) or type(exc).__name__
