"""Many Lua script calls (and plain commands) in one Redis round trip.

redis-py's pipelines send ``SCRIPT EXISTS`` before every execution that holds a script, which doubles the
round trips of a small batch. A :class:`ScriptBatch` sends ``EVALSHA`` directly instead; a call that Redis
answers with NOSCRIPT (a restarted or flushed server) is run again on its own through its
:class:`~redis.commands.core.AsyncScript`, which loads the script first. Only the calls that failed that way
are repeated: nothing else in the batch runs twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from msgbusd.store.replication import Replication


class ScriptBatch:
    def __init__(self, redis: aioredis.Redis, replication: Replication | None = None) -> None:
        self._pipe = redis.pipeline(transaction=False)
        self._calls: list[tuple[AsyncScript, list[Any], list[Any]] | None] = []
        self._replication = replication

    def script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self._pipe.evalsha(script.sha, len(keys), *keys, *args)
        self._calls.append((script, list(keys), list(args)))

    def command(self, name: str, *args: Any) -> None:
        """Queue a plain command, such as ``command("lpush", key, value)``."""
        getattr(self._pipe, name)(*args)
        self._calls.append(None)

    async def run(self) -> list[Any]:
        """The answers, in order; raises the first error other than NOSCRIPT."""
        answers = await self.run_each()
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return answers

    async def run_each(self) -> list[Any]:
        """The answers, in order, an error in place of the answer of a call that failed (other than with
        NOSCRIPT); raises only what fails the whole batch (the connection, the replicas' wait)."""
        if not self._calls:
            return []
        async with self._pipe as pipe:
            # On the pipeline's one connection: WAIT covers the writes of its own client.
            wanted = self._replication.queue_on(pipe) if self._replication else 0
            answers = list(await pipe.execute(raise_on_error=False))
        if self._replication is not None:
            self._replication.check(answers, wanted)
        for index, (answer, call) in enumerate(zip(answers, self._calls, strict=True)):
            if isinstance(answer, NoScriptError) and call is not None:
                script, keys, args = call
                try:
                    answers[index] = await script(keys=keys, args=args)
                except RedisError as exc:
                    answers[index] = exc
        return answers
