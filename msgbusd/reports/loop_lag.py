"""How late the daemon's event loop runs, and how long Python's cyclic collector stops it: what a busy cloud
site's operator looks at when its answers come late (``msgbus_event_loop_lag_seconds``,
``msgbus_gc_pause_seconds``).

Everything the daemon does runs on one event loop, so anything long that runs on it (a herd of handshakes,
a walk of the collector) makes everything else wait: a timer asked for every :data:`PERIOD_S` fires that
much later. The collector's passes are timed by its own callbacks (:data:`gc.callbacks`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from msgbusd.reports.metrics import Metrics

PERIOD_S = 0.05


async def watch_loop_lag(metrics: Metrics, stopping: asyncio.Event) -> None:
    """Observe how late a timer every :data:`PERIOD_S` fires, until ``stopping``."""
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        asked = loop.time()
        await asyncio.sleep(PERIOD_S)
        metrics.observe_loop_lag(max(0.0, loop.time() - asked - PERIOD_S))


@contextmanager
def collector_pauses(metrics: Metrics) -> Iterator[None]:
    """Observe every pass of the cyclic collector while inside."""
    started: list[float] = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            metrics.observe_collector_pause(int(info["generation"]), time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    try:
        yield
    finally:
        gc.callbacks.remove(timed)
