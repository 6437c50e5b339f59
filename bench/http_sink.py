"""A cloud API for the router benchmark: counts the POSTs it is sent (``GET /count`` reads the count).

python -m bench.http_sink --port P
"""

from __future__ import annotations

import argparse

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route


def app() -> Starlette:
    received = 0

    async def take(request: Request) -> PlainTextResponse:
        nonlocal received
        await request.body()
        received += 1
        return PlainTextResponse("ok")

    async def count(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(received))

    return Starlette(routes=[Route("/count", count), Route("/{path:path}", take, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
