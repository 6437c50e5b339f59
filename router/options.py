"""The router's options of the ``msgbusd`` command (a ``msgbusd.companions`` entry point): a cloud site
serves the REST paths, an edge site follows a cloud site's rules; without either the site routes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from msgbusd.site.cli import parse_listen, parse_mqtt_url
from msgbusd.site.serving import bind_socket
from msgbusd.site.settings import Settings
from router.config import DEFAULT_ROUTER_LISTEN, RouterSettings

if TYPE_CHECKING:
    from router.runtime import RouterRuntime


def options(
    router: Annotated[
        bool,
        typer.Option(
            "--router",
            help="Cloud site: serve the rules router's REST paths /{node}/[{namespace}/]{path} on "
            "127.0.0.1:9443 (KubeEdge's port).",
        ),
    ] = False,
    router_listen: Annotated[
        str | None,
        typer.Option(
            help="Cloud site: serve the rules router's REST paths here (HOST:PORT; implies --router)."
        ),
    ] = None,
    router_cloud: Annotated[
        str | None,
        typer.Option(help="Edge site: the cloud site (twin id or name) whose rules this site follows."),
    ] = None,
    mqtt: Annotated[
        str | None,
        typer.Option(help="Edge site: the local MQTT broker for eventbus rules (mqtt://HOST:PORT)."),
    ] = None,
    servicebus_listen: Annotated[
        str, typer.Option(help="Edge site: where edge apps call servicebus->rest rules (HOST:PORT).")
    ] = "127.0.0.1:9060",
    router_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a rest<->servicebus caller waits for the answer.")
    ] = 60.0,
    router_message_ttl: Annotated[
        float,
        typer.Option(min=1.0, help="Seconds rest->eventbus and eventbus->rest messages are kept trying."),
    ] = 3600.0,
    router_refresh: Annotated[
        float, typer.Option(min=0.1, help="Edge site: seconds between asking the cloud for its rules.")
    ] = 30.0,
) -> None:
    """The router's options (msgbusd reads this signature; their values go to :func:`make`)."""


def make(values: Mapping[str, Any], settings: Settings) -> RouterRuntime | None:
    """The router roles the options ask for, their sockets bound; None when this site routes nothing."""
    if values["mqtt"] is not None and values["router_cloud"] is None:
        raise typer.BadParameter("--mqtt is for edge sites: give --router-cloud too")
    listen = values["router_listen"]
    router = RouterSettings(
        listen=parse_listen(listen) if listen else DEFAULT_ROUTER_LISTEN if values["router"] else None,
        cloud=values["router_cloud"],
        mqtt=parse_mqtt_url(values["mqtt"]) if values["mqtt"] is not None else None,
        servicebus_listen=parse_listen(values["servicebus_listen"]),
        call_timeout_s=values["router_timeout"],
        message_ttl_s=values["router_message_ttl"],
        refresh_s=values["router_refresh"],
        max_body_bytes=settings.max_message_bytes,
        retry_delay_s=settings.retry_delay_s,
        retry_max_delay_s=settings.retry_max_delay_s,
        drain_grace_s=settings.drain_grace_s,
    )
    if router.listen is None and router.cloud is None:
        return None
    # Loaded only by a site that routes: most do not, and the router's modules cost a fifth of a start.
    from router.runtime import RouterRuntime

    cloud_socket = bind_socket(*router.listen) if router.listen is not None else None
    try:
        servicebus_socket = bind_socket(*router.servicebus_listen) if router.cloud is not None else None
    except BaseException:
        if cloud_socket is not None:
            cloud_socket.close()
        raise
    return RouterRuntime(router, cloud_socket=cloud_socket, servicebus_socket=servicebus_socket)
