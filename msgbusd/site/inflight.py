"""The work a site starts as it goes (a sender for each destination with messages to send), tracked so that
a stop can let it finish. What a piece of work raises is logged; the item it was on stays queued."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from redis.exceptions import RedisError

from msgbusd.reports.metrics import Metrics

log = logging.getLogger("msgbusd")


class InFlight:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        # Set at the first stop signal: stop taking new work and let this finish.
        self.stopping = asyncio.Event()
        # Set at the second: stop waiting for it.
        self.abort = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.create_task(self._logged(work, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` (or until :attr:`abort`) for the work in flight; cancel what is left."""
        pending = {task for task in self._tasks if not task.done()}
        if not pending:
            return
        log.info("waiting for %d in-flight item(s)", len(pending))
        all_done = asyncio.ensure_future(asyncio.wait(pending))
        aborted = asyncio.ensure_future(self.abort.wait())
        await asyncio.wait([all_done, aborted], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        all_done.cancel()
        aborted.cancel()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _logged(self, work: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await work
        except RedisError as exc:
            self._metrics.error("redis")
            log.error("%s: redis failed (%s); the item stays queued for a later attempt", what, exc)
        except Exception:
            log.exception("%s: unexpected failure; the item stays queued", what)
