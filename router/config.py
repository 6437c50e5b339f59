"""What the rules router can be told (its ``msgbusd`` options: :mod:`router.options`)."""

from __future__ import annotations

from dataclasses import dataclass

from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES

DEFAULT_ROUTER_LISTEN = ("127.0.0.1", 9443)
DEFAULT_SERVICEBUS_LISTEN = ("127.0.0.1", 9060)


@dataclass(frozen=True)
class RouterSettings:
    # Cloud site: where the REST ingress listens (None: this site is not a cloud router).
    listen: tuple[str, int] | None = None
    # Edge site: the cloud site's twin id or name (None: this site is not an edge router).
    cloud: str | None = None
    # Edge site: the local MQTT broker, as (host, port) (None: eventbus rules cannot run here).
    mqtt: tuple[str, int] | None = None
    # Edge site: where edge apps call servicebus->rest rules.
    servicebus_listen: tuple[str, int] = DEFAULT_SERVICEBUS_LISTEN
    # How long a rest->servicebus or servicebus->rest caller waits for the answer (KubeEdge: 60 s).
    call_timeout_s: float = 60.0
    # Lifetime of rest->eventbus and eventbus->rest messages: retried until then.
    message_ttl_s: float = 3600.0
    # Time given to one HTTP request to a cloud URL or an edge service.
    http_timeout_s: float = 10.0
    # Edge site: how often it asks the cloud for its rules (also at start and when a message is newer).
    refresh_s: float = 30.0
    # Limit of REST bodies and MQTT payloads.
    max_body_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # eventbus->rest: first delay before another POST to a cloud URL that failed; later ones double
    # (msgbusd's --retry-delay and --retry-max-delay).
    retry_delay_s: float = 5.0
    retry_max_delay_s: float = 60.0
    # How often the cloud router checks whether the rules changed.
    catalog_check_s: float = 0.5
    # Messages handled at once by each router command.
    workers: int = 64
    # Time given to messages being handled when the daemon stops; the others are handled at the next start.
    drain_grace_s: float = 10.0
