"""The routers' commands (``msgbus.<cmd>``), served like any service on the bus: with :class:`client.Service`.

A frame this router version cannot read is the sender's error: it is answered, not logged as a failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import redis.asyncio as aioredis

from client.errors import HandlerError
from client.request import HandlerResult, Request
from client.service import Service
from router.protocol import FrameError

Handler = Callable[[Request], Awaitable[HandlerResult]]


def command_service(
    redis: aioredis.Redis, handlers: Mapping[str, Handler], *, name: str, workers: int, grace_s: float
) -> Service:
    service = Service(redis, workers=workers, name=name, grace_s=grace_s)
    for cmd, handler in handlers.items():
        service.register(cmd, _answering_frame_errors(handler))
    return service


def _answering_frame_errors(handler: Handler) -> Handler:
    async def handle(request: Request) -> HandlerResult:
        try:
            return await handler(request)
        except FrameError as exc:
            raise HandlerError(str(exc) or type(exc).__name__) from exc

    return handle
