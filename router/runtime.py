"""The rules router as a companion of msgbusd: the cloud role, the edge role, or both, with their doors."""

from __future__ import annotations

import asyncio
import logging
import socket

import redis.asyncio as aioredis

from msgbusd.site.companions import SiteHandle
from msgbusd.site.serving import serve_until
from router.cloud import CloudRouter
from router.config import RouterSettings
from router.edge import EdgeRouter

log = logging.getLogger(__name__)


class RouterRuntime:
    """The router roles this site plays, bound to their sockets (bound before the site starts, so that a
    busy port is a start-up error)."""

    def __init__(
        self,
        settings: RouterSettings,
        *,
        cloud_socket: socket.socket | None,
        servicebus_socket: socket.socket | None,
    ) -> None:
        self.settings = settings
        self._cloud_socket = cloud_socket
        self._servicebus_socket = servicebus_socket
        self.cloud: CloudRouter | None = None
        self.edge: EdgeRouter | None = None
        self._redis: aioredis.Redis | None = None

    def attach(self, site: SiteHandle) -> None:
        # Every router command has workers blocked on a pop, each holding a connection.
        self._redis = redis = site.open_redis(8 * self.settings.workers + 100)
        if self._cloud_socket is not None:
            self.cloud = CloudRouter(
                redis=redis,
                submit=site.submit,
                withdraw=site.withdraw,
                resolver=site.resolver,
                settings=self.settings,
                twin=site.twin,
            )
        if self._servicebus_socket is not None:
            self.edge = EdgeRouter(
                redis=redis,
                submit=site.submit,
                resolver=site.resolver,
                settings=self.settings,
                twin=site.twin,
            )
            if self.edge.mqtt is not None:
                site.metrics.watch_mqtt_bridge(self.edge.mqtt.counters)

    async def run(self, stopping: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            if self.cloud is not None and self._cloud_socket is not None:
                group.create_task(self.cloud.run(stopping), name="cloud router")
                group.create_task(
                    serve_until(self.cloud.app(), self._cloud_socket, stopping, self.settings.drain_grace_s),
                    name="router REST",
                )
                log.info("rules router (cloud): REST paths on %s:%s", *self.settings.listen or ("", ""))
            if self.edge is not None and self._servicebus_socket is not None:
                group.create_task(self.edge.run(stopping), name="edge router")
                group.create_task(
                    serve_until(
                        self.edge.app(), self._servicebus_socket, stopping, self.settings.drain_grace_s
                    ),
                    name="servicebus",
                )
                log.info(
                    "rules router (edge of %s): servicebus on %s:%s, MQTT %s",
                    self.settings.cloud,
                    *self.settings.servicebus_listen,
                    "{}:{}".format(*self.settings.mqtt) if self.settings.mqtt else "none",
                )

    async def aclose(self) -> None:
        for sock in (self._cloud_socket, self._servicebus_socket):
            if sock is not None:
                sock.close()
        if self._redis is not None:
            await self._redis.aclose()
