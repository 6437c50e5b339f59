"""What the ``msgbus`` command's parts share: exit codes, failing with a message, Redis errors, URLs shown."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from client.errors import SiteRedisFull
from wire.redis_url import redacted

EXIT_REPLY_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 2
EXIT_REDIS = 3
EXIT_MISSING_DEP = 4


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def redis_errors(redis_url: str) -> Iterator[None]:
    """Turn Redis failures into an exit with status 3 and a line that says what went wrong."""
    try:
        yield
    except SiteRedisFull as exc:
        fail(str(exc), EXIT_REDIS)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        fail(f"cannot connect to Redis at {redact(redis_url)}: {exc}", EXIT_REDIS)
    except RedisError as exc:
        fail(f"Redis error at {redact(redis_url)}: {exc}", EXIT_REDIS)


redact = redacted
