"""The router's MQTT side: publish to and subscribe on an edge site's broker, at least once.

:class:`MqttBridge` wraps a paho-mqtt 2.x client (MQTT 3.1.1, ``CallbackAPIVersion.VERSION2``). paho's
network loop runs in paho's own thread (``loop_start``); whatever it reports is handed to the asyncio loop
with ``call_soon_threadsafe``, so the bridge's state and counters are only touched on the asyncio side.

Publishing: :meth:`MqttBridge.publish` returns once the broker acknowledged the message (PUBACK for QoS 1).
A publish made while the broker is away is kept by paho and sent when it is back; a publish that times out
may therefore still reach the broker later: a timeout means *unknown*, and retrying it may duplicate.

Receiving: the subscriptions are QoS 1 with manual acknowledgement. Each message is handed to the async
``on_message(topic, payload)``, one at a time and in the order received; its PUBACK is sent only after the
callback returned, i.e. once the message is durable elsewhere. With ``on_batch(messages)`` instead, the
messages waiting (up to HANDOFF_BATCH) are handed over together, in order, and acknowledged together.

Redelivery, as mosquitto (2.0) does it, which is what MQTT allows: a broker never resends an
unacknowledged message on the same connection, only when the client reconnects to a session that was kept
(clean session off, the same client id). So when the callback raises, the bridge stops handing out what
that connection delivered (nothing after the failed message is acknowledged either, so the order holds),
waits a backoff delay, and drops the connection; paho reconnects (after ``reconnect_min_delay_s``, one
second by default) and the broker resends every unacknowledged message, flagged DUP. The same happens
on its own when the connection is lost. Hence duplicates are possible (a message whose callback
succeeded just as the connection dropped comes again), losses are not, as long as the broker keeps the
session: across a broker restart only if the broker persists it (mosquitto's ``persistence true``).

Payloads over the size limit are not handed to the callback: they are acknowledged, so they do not come
back forever, counted as rejected and logged. QoS 0 messages (a publisher's choice) are handed over
without any acknowledgement: one whose callback fails is lost. The broker's in-flight window (mosquitto's
``max_inflight_messages``, 20 by default) bounds how many QoS 1 messages wait in the bridge.

Errors (``MqttBridgeError``)::

    PayloadTooLarge   the payload is over the limit              retrying cannot help
    InvalidTopic      a topic or filter that MQTT does not allow retrying cannot help
    PublishRefused    paho or the broker refused the message     retrying as is cannot help
    PublishTimeout    no acknowledgement in time                 delivery unknown; a retry may duplicate
    SubscribeFailed   the broker refused a filter, or no SUBACK  the filter is still sent on every reconnect
                      (or UNSUBACK)
    BridgeClosed      the bridge is closed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from paho.mqtt.client import Client, ConnectFlags, DisconnectFlags, MQTTMessage, error_string
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from router.matching import topic_filter_error, topic_name_error
from wire.backoff import Backoff
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

DEFAULT_MAX_PAYLOAD_BYTES = DEFAULT_MAX_MESSAGE_BYTES

MessageHandler = Callable[[str, bytes], Awaitable[None]]
BatchHandler = Callable[[list[tuple[str, bytes]]], Awaitable[None]]
# Messages waiting in the bridge that one on_batch call takes at most.
HANDOFF_BATCH = 256


class MqttBridgeError(Exception):
    """Base of every error the bridge raises."""


class PayloadTooLarge(MqttBridgeError):
    def __init__(self, topic: str, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"payload for {topic!r} is {size_bytes} bytes, over the limit of {limit_bytes} bytes"
        )
        self.topic = topic
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class InvalidTopic(MqttBridgeError):
    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"invalid topic {topic!r}: {reason}")
        self.topic = topic
        self.reason = reason


class PublishRefused(MqttBridgeError):
    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"publish to {topic!r} refused: {reason}")
        self.topic = topic
        self.reason = reason


class PublishTimeout(MqttBridgeError):
    def __init__(self, topic: str, timeout_s: float) -> None:
        super().__init__(
            f"no acknowledgement from the broker for {topic!r} within {timeout_s}s (delivery unknown)"
        )
        self.topic = topic
        self.timeout_s = timeout_s


class SubscribeFailed(MqttBridgeError):
    def __init__(self, topic_filters: tuple[str, ...], reason: str) -> None:
        super().__init__(f"subscription to {', '.join(topic_filters)} failed: {reason}")
        self.topic_filters = topic_filters
        self.reason = reason


class BridgeClosed(MqttBridgeError):
    def __init__(self) -> None:
        super().__init__("the MQTT bridge is closed")


@dataclass(frozen=True)
class MqttSettings:
    # Fixed, so that the broker keeps this client's session (subscriptions, unacknowledged messages).
    client_id: str
    host: str = "127.0.0.1"
    port: int = 1883
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    publish_timeout_s: float = 10.0
    subscribe_timeout_s: float = 10.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # paho's own reconnection delays: whole seconds, doubling from the first to the second.
    reconnect_min_delay_s: int = 1
    reconnect_max_delay_s: int = 30
    # Before dropping a connection so that the broker resends what a failing callback did not take.
    redelivery: Backoff = field(default_factory=lambda: Backoff(base_s=0.5, max_s=30.0))


@dataclass
class BridgeCounters:
    published: int = 0  # acknowledged by the broker
    delivered: int = 0  # handed to on_message, which returned
    failed: int = 0  # on_message raised: not acknowledged, the broker resends it
    rejected: int = 0  # over the size limit, or a topic that is not UTF-8: acknowledged and dropped
    redelivered: int = 0  # arrived flagged DUP
    connections: int = 0  # successful CONNACKs
    resubscribed: int = 0  # SUBACKs of the subscriptions sent again on a new connection


@dataclass(frozen=True)
class _Incoming:
    connection: int
    mid: int
    qos: int
    dup: bool
    topic: str | None  # None: not UTF-8
    payload: bytes


class MqttBridge:
    """One MQTT client: ``async with MqttBridge(settings, on_message) as bridge: ...``."""

    def __init__(
        self,
        settings: MqttSettings,
        on_message: MessageHandler | None = None,
        *,
        on_batch: BatchHandler | None = None,
    ) -> None:
        if on_message is not None and on_batch is not None:
            raise ValueError("give on_message or on_batch, not both")
        self._settings = settings
        self._on_message = on_message
        self._on_batch = on_batch
        self.counters = BridgeCounters()
        self._client = Client(
            CallbackAPIVersion.VERSION2,
            client_id=settings.client_id,
            clean_session=False,
            protocol=MQTTProtocolVersion.MQTTv311,
            manual_ack=True,
        )
        self._client.connect_timeout = settings.connect_timeout_s
        self._client.reconnect_delay_set(settings.reconnect_min_delay_s, settings.reconnect_max_delay_s)
        self._client.on_connect = self._paho_connected
        self._client.on_disconnect = self._paho_disconnected
        self._client.on_message = self._paho_message
        self._client.on_publish = self._paho_published
        self._client.on_subscribe = self._paho_subscribed
        self._client.on_unsubscribe = self._paho_unsubscribed
        self._filters: tuple[str, ...] = ()
        # Filters given up whose UNSUBACK has not come: sent again on every connection (the broker keeps
        # the subscriptions of a kept session).
        self._dropped_filters: tuple[str, ...] = ()
        # Connections are numbered from 1 in paho's thread; 0: none yet.
        self._paho_connection = 0
        # The mids of the subscriptions sent again on a new connection (paho's thread only).
        self._resubscribe_mids: set[int] = set()
        # The asyncio side's view: the connection that is up (None: none) and the one given up on.
        self._live_connection: int | None = None
        self._abandoned_connection: int | None = None
        self._handoff_failures = 0
        self._connected = asyncio.Event()
        self._inbox: asyncio.Queue[_Incoming] = asyncio.Queue()
        # mid -> what the broker answered: None when it accepted, else why it refused.
        self._pending_publishes: dict[int, asyncio.Future[str | None]] = {}
        self._pending_subscribes: dict[int, asyncio.Future[str | None]] = {}
        self._pending_unsubscribes: dict[int, asyncio.Future[str | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def __aenter__(self) -> MqttBridge:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        """Start connecting (in the background, retried until :meth:`close`) and handing messages out."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._spawn(self._deliver_forever())
        self._client.connect_async(self._settings.host, self._settings.port, self._settings.keepalive_s)
        self._client.loop_start()

    async def wait_connected(self, timeout_s: float) -> None:
        """Wait until a connection is up; ``TimeoutError`` after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            await self._connected.wait()

    async def subscribe(self, *topic_filters: str) -> None:
        """Subscribe to ``topic_filters`` (QoS 1, ``+`` and ``#`` allowed), now and after every reconnect.

        Waits for the broker's SUBACK when connected; otherwise the filters are sent on connection.
        """
        self._check_open()
        for topic_filter in topic_filters:
            if (reason := topic_filter_error(topic_filter)) is not None:
                raise InvalidTopic(topic_filter, reason)
        new = tuple(f for f in dict.fromkeys(topic_filters) if f not in self._filters)
        if not new:
            return
        self._filters = (*self._filters, *new)
        self._dropped_filters = tuple(f for f in self._dropped_filters if f not in new)
        rc, mid = self._client.subscribe([(f, 1) for f in new])
        if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            return
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise SubscribeFailed(new, error_string(rc))
        answer: asyncio.Future[str | None] = self._running_loop().create_future()
        self._pending_subscribes[mid] = answer
        try:
            async with asyncio.timeout(self._settings.subscribe_timeout_s):
                refusal = await answer
        except TimeoutError as exc:
            raise SubscribeFailed(new, f"no SUBACK within {self._settings.subscribe_timeout_s}s") from exc
        finally:
            self._pending_subscribes.pop(mid, None)
        if refusal is not None:
            raise SubscribeFailed(new, refusal)

    async def unsubscribe(self, *topic_filters: str) -> None:
        """Stop receiving on ``topic_filters``; returns once the broker acknowledged it (UNSUBACK), waiting
        for a connection if there is none. On ``SubscribeFailed`` the filters are still dropped: the bridge
        tells the broker again on every connection until it has acknowledged."""
        self._check_open()
        gone = tuple(dict.fromkeys(topic_filters))
        if not gone:
            return
        self._filters = tuple(f for f in self._filters if f not in gone)
        self._dropped_filters = (*(f for f in self._dropped_filters if f not in gone), *gone)
        timeout_s = self._settings.subscribe_timeout_s
        mid: int | None = None
        try:
            async with asyncio.timeout(timeout_s):
                await self._connected.wait()
                rc, mid = self._client.unsubscribe(list(gone))
                if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
                    raise SubscribeFailed(gone, error_string(rc))
                answer: asyncio.Future[str | None] = self._running_loop().create_future()
                self._pending_unsubscribes[mid] = answer
                refusal = await answer
        except TimeoutError as exc:
            raise SubscribeFailed(gone, f"no UNSUBACK within {timeout_s}s") from exc
        finally:
            if mid is not None:
                self._pending_unsubscribes.pop(mid, None)
        if refusal is not None:
            raise SubscribeFailed(gone, refusal)
        self._dropped_filters = tuple(f for f in self._dropped_filters if f not in gone)

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        """Publish ``payload`` on ``topic``; return once the broker acknowledged it (at once for QoS 0)."""
        self._check_open()
        if (reason := topic_name_error(topic)) is not None:
            raise InvalidTopic(topic, reason)
        if len(payload) > self._settings.max_payload_bytes:
            raise PayloadTooLarge(topic, len(payload), self._settings.max_payload_bytes)
        try:
            info = self._client.publish(topic, payload, qos=qos)
        except ValueError as exc:
            raise PublishRefused(topic, str(exc)) from exc
        # Not connected: paho keeps the message and sends it once it is connected again.
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise PublishRefused(topic, error_string(info.rc))
        if qos == 0:
            return
        # PUBACKs reach the asyncio loop through call_soon_threadsafe, so none can be handled before this.
        answer: asyncio.Future[str | None] = self._running_loop().create_future()
        self._pending_publishes[info.mid] = answer
        try:
            async with asyncio.timeout(self._settings.publish_timeout_s):
                refusal = await answer
        except TimeoutError as exc:
            raise PublishTimeout(topic, self._settings.publish_timeout_s) from exc
        finally:
            self._pending_publishes.pop(info.mid, None)
        if refusal is not None:
            raise PublishRefused(topic, refusal)
        self.counters.published += 1

    async def close(self) -> None:
        """Disconnect cleanly (the broker keeps the session) and stop paho's thread.

        A message whose callback is still running is not acknowledged: the broker resends it next time.
        """
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)
        self._connected.clear()
        pending = (self._pending_publishes, self._pending_subscribes, self._pending_unsubscribes)
        for waiting in (future for answers in pending for future in answers.values()):
            if not waiting.done():
                waiting.set_exception(BridgeClosed())

    # The asyncio side.

    async def _deliver_forever(self) -> None:
        while True:
            batch = [await self._inbox.get()]
            if self._on_batch is not None:
                while len(batch) < HANDOFF_BATCH and not self._inbox.empty():
                    batch.append(self._inbox.get_nowait())
            taken = [incoming for incoming in batch if self._takeable(incoming)]
            if not taken:
                continue
            if await self._hand_off(taken):
                self._handoff_failures = 0
                self.counters.delivered += len(taken)
                for incoming in taken:
                    self._acknowledge(incoming)
            elif any(incoming.qos > 0 for incoming in taken):
                self._handoff_failures += 1
                self._abandoned_connection = taken[0].connection
                self._spawn(self._reconnect_for_redelivery(taken[0].connection))

    def _takeable(self, incoming: _Incoming) -> bool:
        """Whether to hand ``incoming`` out: not when its connection is gone (the broker resends it), nor
        when it is rejected (then it is acknowledged, so that it does not come back)."""
        if incoming.connection != self._live_connection or incoming.connection == self._abandoned_connection:
            return False
        if incoming.dup:
            self.counters.redelivered += 1
        rejection = self._rejection(incoming)
        if rejection is None:
            return True
        self.counters.rejected += 1
        log.warning(
            "mqtt %s: rejected message %d on %r: %s",
            self._settings.client_id, incoming.mid, incoming.topic, rejection,
        )  # fmt: skip
        self._acknowledge(incoming)
        return False

    def _rejection(self, incoming: _Incoming) -> str | None:
        if incoming.topic is None:
            return "the topic is not UTF-8"
        if len(incoming.payload) > self._settings.max_payload_bytes:
            return (
                f"{len(incoming.payload)} bytes, over the limit of {self._settings.max_payload_bytes} bytes"
            )
        return None

    async def _hand_off(self, batch: list[_Incoming]) -> bool:
        messages = [(incoming.topic or "", incoming.payload) for incoming in batch]
        try:
            if self._on_batch is not None:
                await self._on_batch(messages)
            elif self._on_message is not None:
                (message,) = messages
                await self._on_message(*message)
        except Exception:
            self.counters.failed += len(batch)
            log.exception(
                "mqtt %s: handing over %d message(s) from %d on %r failed; not acknowledged",
                self._settings.client_id, len(batch), batch[0].mid, batch[0].topic,
            )  # fmt: skip
            return False
        return True

    def _acknowledge(self, incoming: _Incoming) -> None:
        # A message from a connection that is gone is resent by the broker; its mid means nothing now.
        if incoming.qos > 0 and incoming.connection == self._live_connection:
            self._client.ack(incoming.mid, incoming.qos)

    async def _reconnect_for_redelivery(self, connection: int) -> None:
        delay_s = self._settings.redelivery.delay_s(self._handoff_failures)
        log.info(
            "mqtt %s: reconnecting in %.2fs so that the broker resends unacknowledged messages",
            self._settings.client_id, delay_s,
        )  # fmt: skip
        await asyncio.sleep(delay_s)
        if self._live_connection != connection:
            return  # already gone: the next connection gets the messages again
        sock = self._client.socket()
        # Not disconnect(): that would end paho's network thread. A dead socket makes paho reconnect.
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # closed meanwhile by paho's thread
                sock.shutdown(socket.SHUT_RDWR)

    def _connection_up(self, connection: int, session_present: bool) -> None:
        self._live_connection = connection
        self.counters.connections += 1
        self._connected.set()
        log.info(
            "mqtt %s: connected to %s:%d (session kept: %s)",
            self._settings.client_id, self._settings.host, self._settings.port, session_present,
        )  # fmt: skip

    def _resubscribed(self, refusal: str | None) -> None:
        if refusal is None:
            self.counters.resubscribed += 1
        else:
            client_id = self._settings.client_id
            log.error("mqtt %s: the broker refused a subscription again: %s", client_id, refusal)

    def _connection_down(self, reason: str) -> None:
        self._live_connection = None
        self._connected.clear()
        if not self._closed:
            log.warning(
                "mqtt %s: disconnected from %s:%d: %s",
                self._settings.client_id, self._settings.host, self._settings.port, reason,
            )  # fmt: skip

    @staticmethod
    def _answer(pending: dict[int, asyncio.Future[str | None]], mid: int, refusal: str | None) -> None:
        waiting = pending.get(mid)
        if waiting is not None and not waiting.done():
            waiting.set_result(refusal)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("mqtt %s: internal task failed", self._settings.client_id, exc_info=task.exception())

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("MqttBridge.start() was not called")
        return self._loop

    def _check_open(self) -> None:
        if self._closed:
            raise BridgeClosed()
        self._running_loop()

    # paho's thread: only hand things over to the asyncio loop.

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> None:
        if self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(callback, *args)

    def _paho_connected(
        self, client: Client, userdata: Any, flags: ConnectFlags, reason: ReasonCode, props: Properties | None
    ) -> None:
        if reason.is_failure:
            self._to_loop(self._connection_down, f"connection refused: {reason}")
            return
        self._paho_connection += 1
        if self._filters:
            rc, mid = client.subscribe([(f, 1) for f in self._filters])
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                self._resubscribe_mids.add(mid)
        if self._dropped_filters:
            client.unsubscribe(list(self._dropped_filters))
        self._to_loop(self._connection_up, self._paho_connection, flags.session_present)

    def _paho_disconnected(
        self,
        client: Client,
        userdata: Any,
        flags: DisconnectFlags,
        reason: ReasonCode,
        props: Properties | None,
    ) -> None:
        self._to_loop(self._connection_down, str(reason))

    def _paho_message(self, client: Client, userdata: Any, message: MQTTMessage) -> None:
        try:
            topic: str | None = message.topic
        except UnicodeDecodeError:
            topic = None
        incoming = _Incoming(
            self._paho_connection, message.mid, message.qos, bool(message.dup), topic, bytes(message.payload)
        )
        self._to_loop(self._inbox.put_nowait, incoming)

    def _paho_published(
        self, client: Client, userdata: Any, mid: int, reason: ReasonCode, props: Properties
    ) -> None:
        self._to_loop(self._answer, self._pending_publishes, mid, str(reason) if reason.is_failure else None)

    def _paho_unsubscribed(
        self, client: Client, userdata: Any, mid: int, reasons: list[ReasonCode], props: Properties | None
    ) -> None:
        refused = [str(reason) for reason in reasons if reason.is_failure]
        self._to_loop(self._answer, self._pending_unsubscribes, mid, "; ".join(refused) if refused else None)

    def _paho_subscribed(
        self, client: Client, userdata: Any, mid: int, reasons: list[ReasonCode], props: Properties | None
    ) -> None:
        refused = [str(reason) for reason in reasons if reason.is_failure]
        if mid in self._resubscribe_mids:
            self._resubscribe_mids.discard(mid)
            self._to_loop(self._resubscribed, "; ".join(refused) if refused else None)
            return
        self._to_loop(self._answer, self._pending_subscribes, mid, "; ".join(refused) if refused else None)
