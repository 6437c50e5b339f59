"""How late the event loop runs and how long the cyclic collector stops it, as /metrics shows them."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client.parser import text_string_to_metric_families

from msgbusd.reports.loop_lag import PERIOD_S, collector_pauses, watch_loop_lag
from msgbusd.reports.metrics import Metrics


def observed(metrics: Metrics, name: str, over_s: float, **labels: str) -> tuple[float, float]:
    """How many observations of histogram ``name`` there are, and how many above ``over_s`` (a bound)."""
    body, _ = metrics.render()
    buckets = {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == f"{name}_bucket" and all(sample.labels.get(k) == v for k, v in labels.items())
    }
    total = buckets[float("inf")]
    return total, total - buckets[over_s]


def work_for(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


async def test_a_loop_kept_busy_is_seen_late() -> None:
    metrics = Metrics()
    stopping = asyncio.Event()
    watching = asyncio.ensure_future(watch_loop_lag(metrics, stopping))
    await asyncio.sleep(3 * PERIOD_S)
    work_for(0.3)  # something long on the loop
    await asyncio.sleep(3 * PERIOD_S)
    stopping.set()
    await watching
    total, late = observed(metrics, "msgbus_event_loop_lag_seconds", 0.1)
    assert total >= 4 and late == 1


def test_each_pass_of_the_collector_is_timed_by_generation() -> None:
    metrics = Metrics()
    with collector_pauses(metrics):
        gc.collect(0)
        gc.collect(2)
    gc.collect()  # not inside: not timed
    assert observed(metrics, "msgbus_gc_pause_seconds", 0.1, generation="0")[0] == 1
    assert observed(metrics, "msgbus_gc_pause_seconds", 0.1, generation="2")[0] == 1
