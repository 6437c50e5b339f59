"""msgbus client library: call services on other twins through the local site's daemon, and serve commands.

Only needs ``redis`` (and ``typer`` for the ``msgbus`` command); the daemon's web stack is not imported.
"""

from client.aio import AsyncClient
from client.errors import ClientError, HandlerError, ProtocolError, SiteRedisFull
from client.protocol import DEFAULT_EXP_S, DEFAULT_REDIS_URL, DEFAULT_RETRIES
from client.replies import CallTimeout, RemoteError, Reply
from client.request import HandlerResult, Request
from client.serve_exec import exec_handler
from client.service import Handler, Service
from client.sync import Client

__all__ = [
    "DEFAULT_EXP_S",
    "DEFAULT_REDIS_URL",
    "DEFAULT_RETRIES",
    "AsyncClient",
    "CallTimeout",
    "Client",
    "ClientError",
    "Handler",
    "HandlerError",
    "HandlerResult",
    "ProtocolError",
    "RemoteError",
    "Reply",
    "Request",
    "Service",
    "SiteRedisFull",
    "exec_handler",
]
