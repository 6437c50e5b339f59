"""Metrics: counters, histograms, scrape-time gauges, and the /metrics and /healthz endpoints."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Route

from msgbusd.reports.metrics import (
    ERROR_CAUSES,
    MESSAGE_EVENTS,
    HealthCheck,
    Metrics,
    Refresh,
    healthz_endpoint,
    metrics_endpoint,
)

Scrape = Callable[..., Awaitable[httpx.Response]]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition text, keyed by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float:
    body, _ = metrics.render()
    return samples(body.decode())[(name, frozenset(labels.items()))]


def client_for(
    metrics: Metrics | None = None, check: HealthCheck | None = None, refresh: Refresh | None = None
) -> httpx.AsyncClient:
    routes = []
    if metrics is not None:
        routes.append(Route("/metrics", metrics_endpoint(metrics, refresh)))
    if check is not None:
        routes.append(Route("/healthz", healthz_endpoint(check, timeout_s=0.2)))
    transport = httpx.ASGITransport(app=Starlette(routes=routes))
    return httpx.AsyncClient(transport=transport, base_url="http://site")


@pytest.fixture
async def scrape() -> AsyncIterator[Scrape]:
    clients: list[httpx.AsyncClient] = []

    async def get(metrics: Metrics, refresh: Refresh | None = None) -> httpx.Response:
        client = client_for(metrics, refresh=refresh)
        clients.append(client)
        return await client.get("/metrics")

    yield get
    for client in clients:
        await client.aclose()


def test_every_series_starts_at_zero() -> None:
    body, _ = Metrics().render()
    found = samples(body.decode())
    for event in MESSAGE_EVENTS:
        assert found[("msgbus_messages_total", frozenset({("event", event)}))] == 0
    for cause in ERROR_CAUSES:
        assert found[("msgbus_errors_total", frozenset({("cause", cause)}))] == 0
    for path in ("remote", "reply"):
        assert found[("msgbus_send_seconds_count", frozenset({("path", path)}))] == 0
    assert found[("msgbus_round_trip_seconds_count", frozenset())] == 0


def test_counters_increment_and_show_in_the_text() -> None:
    metrics = Metrics()
    metrics.message("sent")
    metrics.message("sent", 2)
    metrics.message("dead_lettered")
    metrics.error("unreachable")
    metrics.error("unreachable")

    text = metrics.render()[0].decode()
    assert 'msgbus_messages_total{event="sent"} 3.0' in text
    assert 'msgbus_messages_total{event="dead_lettered"} 1.0' in text
    assert 'msgbus_messages_total{event="accepted"} 0.0' in text
    assert 'msgbus_errors_total{cause="unreachable"} 2.0' in text
    assert "# TYPE msgbus_messages_total counter" in text


def test_label_values_outside_the_sets_are_refused() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="not one of"):
        metrics.message("lost")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of"):
        metrics.error("gremlins")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of"):
        metrics.observe_send("sideways", 1.0)  # type: ignore[arg-type]


def test_histogram_buckets() -> None:
    metrics = Metrics()
    metrics.observe_send("remote", 0.003)
    metrics.observe_send("remote", 0.2)
    metrics.observe_send("reply", 12.0)
    metrics.observe_round_trip(0.04)

    def bucket(name: str, le: str, **labels: str) -> float:
        return value(metrics, f"{name}_bucket", le=le, **labels)

    assert bucket("msgbus_send_seconds", "0.0025", path="remote") == 0
    assert bucket("msgbus_send_seconds", "0.005", path="remote") == 1
    assert bucket("msgbus_send_seconds", "0.25", path="remote") == 2
    assert bucket("msgbus_send_seconds", "+Inf", path="remote") == 2
    assert value(metrics, "msgbus_send_seconds_count", path="remote") == 2
    assert value(metrics, "msgbus_send_seconds_sum", path="remote") == pytest.approx(0.203)
    assert bucket("msgbus_send_seconds", "10.0", path="reply") == 0
    assert bucket("msgbus_send_seconds", "30.0", path="reply") == 1
    assert bucket("msgbus_round_trip_seconds", "0.025") == 0
    assert bucket("msgbus_round_trip_seconds", "0.05") == 1
    assert bucket("msgbus_round_trip_seconds", "3600.0") == 1


def test_each_daemon_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.message("sent")
    assert value(first, "msgbus_messages_total", event="sent") == 1
    assert value(second, "msgbus_messages_total", event="sent") == 0
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "msgbus_" not in global_text


async def test_refresh_is_awaited_before_each_scrape(scrape: Scrape) -> None:
    calls = 0

    async def refresh() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)  # like a Redis round trip
        metrics.set_queue_lengths(
            {
                "msgbus.system.local": 3 * calls,
                "msgbus.system.remote": 0,
                "msgbus.system.reply": 1,
                "msgbus.system.backlog": 7,
            }
        )
        metrics.set_inflight(2)
        metrics.set_peers_down(1)

    metrics = Metrics()
    first = await scrape(metrics, refresh)
    second = await scrape(metrics, refresh)

    assert calls == 2
    assert first.status_code == second.status_code == 200
    assert first.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    found = samples(second.text)
    assert found[("msgbus_queue_length", frozenset({("queue", "msgbus.system.local")}))] == 6
    assert found[("msgbus_queue_length", frozenset({("queue", "msgbus.system.backlog")}))] == 7
    assert found[("msgbus_queue_length", frozenset({("queue", "msgbus.system.reply")}))] == 1
    assert found[("msgbus_inflight", frozenset())] == 2
    assert found[("msgbus_peers_down", frozenset())] == 1
    assert found[("msgbus_refresh_ok", frozenset())] == 1


async def test_failed_refresh_leaves_stale_gauges(scrape: Scrape, caplog: pytest.LogCaptureFixture) -> None:
    fail = False

    async def refresh() -> None:
        if fail:
            raise ConnectionError("redis is down")
        metrics.set_inflight(5)

    metrics = Metrics()
    metrics.message("received")
    await scrape(metrics, refresh)
    fail = True
    with caplog.at_level(logging.WARNING, logger="msgbusd.metrics"):
        response = await scrape(metrics, refresh)

    assert response.status_code == 200
    found = samples(response.text)
    assert found[("msgbus_refresh_ok", frozenset())] == 0
    assert found[("msgbus_inflight", frozenset())] == 5
    assert found[("msgbus_messages_total", frozenset({("event", "received")}))] == 1
    assert "redis is down" in caplog.text


async def test_slow_refresh_times_out(scrape: Scrape) -> None:
    async def refresh() -> None:
        await asyncio.sleep(10)

    metrics = Metrics(refresh_timeout_s=0.05)
    response = await scrape(metrics, refresh)
    assert response.status_code == 200
    assert samples(response.text)[("msgbus_refresh_ok", frozenset())] == 0


async def test_openmetrics_on_request() -> None:
    metrics = Metrics()
    metrics.message("sent")
    async with client_for(metrics) as client:
        response = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    assert 'msgbus_messages_total{event="sent"} 1.0' in response.text


async def test_healthz_ok() -> None:
    async def check() -> dict[str, object]:
        return {"redis": "ok", "loops": ["local", "remote", "reply", "timers"], "problems": []}

    async with client_for(check=check) as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "ok", "redis": "ok", "loops": ["local", "remote", "reply", "timers"]}


async def test_healthz_unhealthy() -> None:
    async def check() -> dict[str, object]:
        return {"redis": "down", "status": "ignored", "problems": ["redis ping failed: connection refused"]}

    async with client_for(check=check) as client:
        response = await client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unhealthy",
        "problems": ["redis ping failed: connection refused"],
        "redis": "down",
    }


async def test_healthz_check_that_raises_or_hangs() -> None:
    async def broken() -> dict[str, object]:
        raise RuntimeError("loop registry gone")

    async def hanging() -> dict[str, object]:
        await asyncio.sleep(10)
        return {}

    async with client_for(check=broken) as client:
        response = await client.get("/healthz")
    assert response.status_code == 503
    assert json.loads(response.text) == {
        "status": "unhealthy",
        "problems": ["health check failed: loop registry gone"],
    }

    async with client_for(check=hanging) as client:
        response = await client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["problems"] == ["health check failed: timed out"]
