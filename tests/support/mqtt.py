"""Real mosquitto brokers for tests, and what tests need around an MQTT bridge.

Load the fixtures with ``pytest_plugins = ["tests.support.mqtt"]``: ``mosquitto_server`` is one broker for
the whole run (tests keep apart by their own client ids and topics, see ``mqtt_names``); ``mosquitto`` is a
broker of the test's own, for tests that stop or restart it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from router.mqtt_bridge import MqttSettings
from testing.local_mqtt import MosquittoProcess
from wire.backoff import Backoff


@pytest.fixture(scope="session")
def mosquitto_server() -> Iterator[MosquittoProcess]:
    server = MosquittoProcess().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def mosquitto() -> Iterator[MosquittoProcess]:
    server = MosquittoProcess().start()
    try:
        yield server
    finally:
        server.cleanup()


@dataclass(frozen=True)
class MqttNames:
    """Client ids and topics of one test, so that tests sharing a broker never see each other."""

    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")

    def client_id(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def topic(self, path: str) -> str:
        return f"{self.prefix}/{path}"


@pytest.fixture
def mqtt_names() -> MqttNames:
    return MqttNames()


def bridge_settings(server: MosquittoProcess, client_id: str, **overrides: Any) -> MqttSettings:
    """Settings for a bridge to ``server`` with test-sized delays."""
    settings = MqttSettings(
        client_id=client_id, host="127.0.0.1", port=server.port, redelivery=Backoff(base_s=0.05, max_s=0.2)
    )
    return replace(settings, **overrides)


class Received:
    """An ``on_message`` callback that records what it was given; tests wait on it, never sleep."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._changed = asyncio.Condition()

    async def __call__(self, topic: str, payload: bytes) -> None:
        async with self._changed:
            self.messages.append((topic, payload))
            self._changed.notify_all()

    async def wait_for_count(self, count: int, timeout_s: float = 10.0) -> list[tuple[str, bytes]]:
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: len(self.messages) >= count)
        return list(self.messages)
