"""The MQTT bridge against real mosquitto processes: acknowledgements both ways, redelivery, restarts."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from router.mqtt_bridge import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    BridgeClosed,
    InvalidTopic,
    MqttBridge,
    PayloadTooLarge,
    PublishTimeout,
)
from testing.local_mqtt import MosquittoProcess
from tests.support import mqtt as mqtt_support
from tests.support.mqtt import MqttNames, Received, bridge_settings
from tests.support.waiting import wait_for

# The brokers' fixtures, under the names the tests ask for.
mosquitto = mqtt_support.mosquitto
mosquitto_server = mqtt_support.mosquitto_server
mqtt_names = mqtt_support.mqtt_names

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[str, bytes], Awaitable[None]]


@asynccontextmanager
async def running_bridge(
    server: MosquittoProcess,
    client_id: str,
    on_message: Handler | None = None,
    subscribe: tuple[str, ...] = (),
    **overrides: object,
) -> AsyncIterator[MqttBridge]:
    async with MqttBridge(bridge_settings(server, client_id, **overrides), on_message) as bridge:
        await bridge.wait_connected(10.0)
        if subscribe:
            await bridge.subscribe(*subscribe)
        yield bridge


async def test_publish_returns_once_the_broker_acknowledged(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    topic = mqtt_names.topic("edge/out")
    async with (
        running_bridge(mosquitto_server, mqtt_names.client_id("sub"), received, (topic,)) as subscriber,
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        await publisher.publish(topic, b"hello")

        assert publisher.counters.published == 1
        assert await received.wait_for_count(1) == [(topic, b"hello")]
        await wait_for(lambda: subscriber.counters.delivered == 1, what="the delivery to be counted")


async def test_publish_without_a_broker_times_out(mosquitto: MosquittoProcess, mqtt_names: MqttNames) -> None:
    async with running_bridge(mosquitto, mqtt_names.client_id("pub"), publish_timeout_s=0.3) as publisher:
        mosquitto.stop()
        await wait_for(lambda: not publisher.connected, what="the bridge to see the broker gone")

        with pytest.raises(PublishTimeout, match="delivery unknown"):
            await publisher.publish(mqtt_names.topic("a"), b"lost?")
        assert publisher.counters.published == 0


async def test_publish_made_while_the_broker_is_away_completes_when_it_is_back(
    mosquitto: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    async with running_bridge(mosquitto, mqtt_names.client_id("pub")) as publisher:
        mosquitto.stop()
        await wait_for(lambda: not publisher.connected, what="the bridge to see the broker gone")
        publishing = asyncio.ensure_future(publisher.publish(mqtt_names.topic("a"), b"later"))
        mosquitto.start()

        await asyncio.wait_for(publishing, 10.0)
        assert publisher.counters.published == 1


async def test_wildcard_subscriptions_deliver_the_matching_topics_only(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    filters = (mqtt_names.topic("sensors/+/temp"), mqtt_names.topic("alerts/#"))
    published = {
        "sensors/a/temp": True,
        "sensors/b/temp": True,
        "sensors/a/humidity": False,
        "sensors/a/temp/raw": False,
        "alerts": True,
        "alerts/fire/zone1": True,
        "other/alerts": False,
    }
    async with (
        running_bridge(mosquitto_server, mqtt_names.client_id("sub"), received, filters),
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        for path in published:
            await publisher.publish(mqtt_names.topic(path), path.encode())
        # Messages reach one subscriber in the order published: once this one is in, every other is too.
        await publisher.publish(mqtt_names.topic("alerts/last"), b"last")
        messages = await received.wait_for_count(sum(published.values()) + 1)

    expected = [mqtt_names.topic(path) for path, matches in published.items() if matches]
    assert [topic for topic, _ in messages] == [*expected, mqtt_names.topic("alerts/last")]


async def test_unsubscribed_filters_deliver_nothing_more(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    kept, dropped = mqtt_names.topic("kept"), mqtt_names.topic("dropped/#")
    async with (
        running_bridge(
            mosquitto_server, mqtt_names.client_id("sub"), received, (kept, dropped)
        ) as subscriber,
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        await subscriber.unsubscribe(dropped)
        await publisher.publish(mqtt_names.topic("dropped/x"), b"not wanted")
        # Messages reach one subscriber in the order published: once this one is in, the other would be.
        await publisher.publish(kept, b"marker")
        messages = await received.wait_for_count(1)
    assert messages == [(kept, b"marker")]


async def test_a_filter_dropped_while_disconnected_is_dropped_from_the_kept_session(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    kept, dropped = mqtt_names.topic("kept"), mqtt_names.topic("dropped")
    async with (
        running_bridge(
            mosquitto_server, mqtt_names.client_id("sub"), received, (kept, dropped)
        ) as subscriber,
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        # Cut the connection (the broker keeps the session, subscriptions included) and drop a filter
        # before the bridge is back: it must tell the broker on the new connection.
        sock = subscriber._client.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)
        await wait_for(lambda: not subscriber.connected, what="the bridge to see the connection gone")
        await subscriber.unsubscribe(dropped)
        await subscriber.wait_connected(10.0)
        await publisher.publish(dropped, b"not wanted")
        await publisher.publish(kept, b"marker")
        messages = await received.wait_for_count(1)
    assert messages == [(kept, b"marker")]


async def test_a_failed_callback_leaves_the_message_unacknowledged_and_the_broker_resends_it(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    attempts: list[bytes] = []
    stored = Received()

    async def store_fails_once(topic: str, payload: bytes) -> None:
        attempts.append(payload)
        if attempts.count(b"first") == 1 and payload == b"first":
            raise ConnectionError("redis is away")
        await stored(topic, payload)

    topic = mqtt_names.topic("edge/in")
    async with (
        running_bridge(
            mosquitto_server, mqtt_names.client_id("sub"), store_fails_once, (topic,)
        ) as subscriber,
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        await publisher.publish(topic, b"first")
        await publisher.publish(topic, b"second")

        assert await stored.wait_for_count(2) == [(topic, b"first"), (topic, b"second")]
        assert subscriber.counters.failed == 1
        assert subscriber.counters.delivered == 2
        assert subscriber.counters.redelivered >= 1
        # The broker resent both on a new connection; "second" was not taken before "first" was.
        assert subscriber.counters.connections == 2
        assert attempts == [b"first", b"first", b"second"]


async def test_a_message_being_handled_at_close_comes_again_to_the_same_client_id(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    started = asyncio.Event()

    async def never_finishes(topic: str, payload: bytes) -> None:
        started.set()
        await asyncio.Event().wait()

    topic = mqtt_names.topic("edge/in")
    client_id = mqtt_names.client_id("sub")
    async with running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher:
        async with running_bridge(mosquitto_server, client_id, never_finishes, (topic,)):
            await publisher.publish(topic, b"in flight")
            await asyncio.wait_for(started.wait(), 10.0)

        received = Received()
        async with running_bridge(mosquitto_server, client_id, received) as again:
            assert await received.wait_for_count(1) == [(topic, b"in flight")]
            assert again.counters.redelivered == 1


async def test_after_a_broker_restart_the_bridge_reconnects_and_subscribes_again(
    mqtt_names: MqttNames,
) -> None:
    # Without persistence the broker forgets every session: only the bridge can restore the subscription.
    broker = MosquittoProcess(persistence=False).start()
    try:
        received = Received()
        topic = mqtt_names.topic("edge/in")
        async with (
            running_bridge(broker, mqtt_names.client_id("sub"), received, (topic,)) as subscriber,
            running_bridge(broker, mqtt_names.client_id("pub")) as publisher,
        ):
            await publisher.publish(topic, b"before")
            await received.wait_for_count(1)

            broker.restart()
            await wait_for(
                lambda: subscriber.counters.resubscribed == 1 and publisher.counters.connections == 2,
                what="both bridges to reconnect, the subscriber's subscription acknowledged again",
            )
            assert subscriber.counters.connections == 2
            await publisher.publish(topic, b"after")

            assert await received.wait_for_count(2) == [(topic, b"before"), (topic, b"after")]
    finally:
        broker.cleanup()


async def test_a_subscription_made_while_the_broker_is_away_is_sent_once_it_is_back(
    mosquitto: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    mosquitto.stop()
    received = Received()
    topic = mqtt_names.topic("edge/in")
    async with MqttBridge(bridge_settings(mosquitto, mqtt_names.client_id("sub")), received) as subscriber:
        await subscriber.subscribe(topic)
        mosquitto.start()
        await subscriber.wait_connected(10.0)
        await wait_for(lambda: subscriber.counters.resubscribed == 1, what="the subscription acknowledged")
        async with running_bridge(mosquitto, mqtt_names.client_id("pub")) as publisher:
            await publisher.publish(topic, b"hello")
            assert await received.wait_for_count(1) == [(topic, b"hello")]


async def test_oversized_payloads_are_refused_before_publishing(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    topic = mqtt_names.topic("big")
    async with running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as default_limit:
        with pytest.raises(PayloadTooLarge) as refused:
            await default_limit.publish(topic, bytes(DEFAULT_MAX_PAYLOAD_BYTES + 1))
        assert (refused.value.size_bytes, refused.value.limit_bytes) == (
            12 * 1024 * 1024 + 1,
            12 * 1024 * 1024,
        )

    async with running_bridge(mosquitto_server, mqtt_names.client_id("pub"), max_payload_bytes=100) as small:
        await small.publish(topic, bytes(100))
        with pytest.raises(PayloadTooLarge, match="101 bytes, over the limit of 100 bytes"):
            await small.publish(topic, bytes(101))
        assert small.counters.published == 1


async def test_oversized_payloads_received_are_acknowledged_and_dropped(
    mosquitto: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    topic = mqtt_names.topic("edge/in")
    async with (
        running_bridge(
            mosquitto, mqtt_names.client_id("sub"), received, (topic,), max_payload_bytes=100
        ) as subscriber,
        running_bridge(mosquitto, mqtt_names.client_id("pub")) as publisher,
    ):
        await publisher.publish(topic, bytes(101))
        await publisher.publish(topic, b"small")
        assert await received.wait_for_count(1) == [(topic, b"small")]
        assert subscriber.counters.rejected == 1
        # The broker handles a client's packets in order: once this PUBACK is in, so are the PUBACKs before.
        await subscriber.publish(mqtt_names.topic("barrier"), b"")

        # Acknowledged: the session the broker keeps across its restart holds nothing to resend.
        mosquitto.restart()
        await wait_for(lambda: subscriber.counters.connections == 2, what="the subscriber to reconnect")
        await wait_for(lambda: publisher.counters.connections == 2, what="the publisher to reconnect")
        await publisher.publish(topic, b"after restart")

        assert await received.wait_for_count(2) == [(topic, b"small"), (topic, b"after restart")]
        assert subscriber.counters.rejected == 1
        assert subscriber.counters.redelivered == 0


async def test_a_burst_of_1000_messages_arrives_exactly_once(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    received = Received()
    topic = mqtt_names.topic("burst")
    async with (
        running_bridge(mosquitto_server, mqtt_names.client_id("sub"), received, (topic,)) as subscriber,
        running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as publisher,
    ):
        await asyncio.gather(*(publisher.publish(topic, str(n).encode()) for n in range(1000)))
        await publisher.publish(topic, b"end")
        messages = await received.wait_for_count(1001, timeout_s=30.0)

        assert publisher.counters.published == 1001
        assert messages[-1] == (topic, b"end")
        counts = Counter(payload for _, payload in messages[:-1])
        assert counts == Counter(str(n).encode() for n in range(1000))
        assert subscriber.counters.redelivered == 0
        assert subscriber.counters.delivered == 1001


async def test_topics_are_checked_and_a_closed_bridge_refuses_work(
    mosquitto_server: MosquittoProcess, mqtt_names: MqttNames
) -> None:
    async with running_bridge(mosquitto_server, mqtt_names.client_id("pub")) as bridge:
        with pytest.raises(InvalidTopic, match="wildcards"):
            await bridge.publish(mqtt_names.topic("a/+"), b"x")
        with pytest.raises(InvalidTopic):
            await bridge.subscribe(mqtt_names.topic("a/#/b"))

    with pytest.raises(BridgeClosed):
        await bridge.publish(mqtt_names.topic("a"), b"x")
    assert not bridge.connected
