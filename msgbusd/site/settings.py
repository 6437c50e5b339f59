"""Everything msgbusd can be told, with its defaults.

Every delay and timeout lives here, so tests can shrink them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_SUBSTRATE_URL = "wss://tfchain.grid.tf"
DEFAULT_PORT = 8051


@dataclass(frozen=True)
class Settings:
    # The secret is kept out of repr so it never reaches a log line or a traceback.
    mnemonics: str = field(repr=False)
    key_type: str = "sr25519"
    twin: int | None = None
    substrate_url: str = DEFAULT_SUBSTRATE_URL
    twins_file: Path | None = None
    # Twin look-ups through the chain or an HTTP source: answers kept this long (go-rmb: 5 minutes), "not
    # found" kept a short while, and the last answer served for this long while the source is unreachable.
    twin_cache_ttl_s: float = 300.0
    twin_negative_ttl_s: float = 10.0
    twin_stale_for_s: float = 3600.0
    twin_lookup_timeout_s: float = 10.0
    redis_url: str = DEFAULT_REDIS_URL
    listen_host: str = "::"
    listen_port: int = DEFAULT_PORT
    # Destination twins sent to at once; the others wait for a turn.
    workers: int = 1000
    # Connections to Redis for the daemon's own work (work waits for a free one, never fails for want of
    # one), and as many again for the HTTP door, which answers 503 with Retry-After when it gets none in time.
    redis_connections: int = 64
    door_redis_wait_s: float = 2.0
    # While a twin does not answer, it is probed every probe_interval_s at first, then every twice that.
    probe_interval_s: float = 1.0
    # Probes of all the twins that do not answer, at most this many a second (0: no bound): with many down,
    # each is probed less often.
    probe_rate: float = 50.0
    log_level: str = "info"

    # Time a POST to a peer may take (go-rmb: 10 s).
    send_timeout_s: float = 10.0
    # First delay before re-sending a failed request or reply (go-rmb: 5 s); later ones double, up to the max.
    retry_delay_s: float = 5.0
    retry_max_delay_s: float = 60.0
    # A request older than this (by its `now`) is refused at the HTTP door.
    freshness_s: float = 60.0
    # Bodies over this are refused (413); batches to other sites are cut to stay under it.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Messages per second (and burst) accepted from one source twin; 0: no limit.
    rate_limit: float = 0.0
    rate_burst: float = 100.0
    # How often the retry and expiry timers look for due work.
    tick_s: float = 0.2
    # Longest blocking pop (it also bounds how long a stop waits for the consumers).
    pop_block_s: float = 1.0
    # Time given to in-flight work after the first SIGTERM before it is left for the next start.
    drain_grace_s: float = 10.0
    # Keep messages to an unreachable twin (without spending their tries) until it is back or they expire.
    hold_offline: bool = False
    # Messages to and from other msgbus sites go over one WebSocket per peer (else one POST per batch, as
    # to go-rmb sites); a link this site opened that is silent this long has its connection checked (the
    # kernel's keepalive), and one found dead is closed within about as long again.
    links: bool = True
    link_ping_s: float = 5.0
    # Links other sites open are let begin at this rate at most (a herd of edges is let in in turns).
    link_handshakes_per_s: float = 1000.0
    # A link that carried nothing this long is closed (opened again when there is work); at most this many
    # links are open at once, the least recently used one closed first (each holds a socket).
    link_idle_s: float = 300.0
    max_links: int = 4096
    # The twins this site keeps a link open to, for their sites to reach it (it cannot be dialed).
    uplinks: tuple[int, ...] = ()
    # Relay for the twins whose entries name a relay: they keep links to this site, which sends them what
    # other sites sent them (--relay).
    relay: bool = False
    # A link to a twin is opened once this many messages go to it at once, or when it is sent one within
    # 10 s of the last; until then (one message now and then) they go in POSTs.
    link_after: int = 2
    # A message with a larger payload is sent beside the others (0: every message in queue order).
    large_message_bytes: int = 65536
    # Where to write the event log (None: no event log), and when to start its next file.
    event_log_dir: Path | None = None
    event_log_max_bytes: int = 64 * 1024 * 1024
    event_log_rotate_s: float = 3600.0
    handle_signals: bool = True
    # This process among the site's instances (None: "<host>:<pid>"), and how long an instance that stopped
    # beating keeps its leases and its unfinished items before a live one takes them over.
    instance: str | None = None
    instance_lease_s: float = 5.0
    # Listen with SO_REUSEPORT, so that the site's processes on this machine share one address.
    reuse_port: bool = False
    # Hand-offs the daemon acknowledges wait until this many replicas of its Redis have them (WAIT).
    redis_wait_replicas: int = 0
    # Run this many processes of the site under one parent (msgbusd.site.supervisor); 1: this one.
    processes: int = 1
    # Also serve this process's /metrics, /healthz and /status here (None: on the site's address only).
    metrics_listen: tuple[str, int] | None = None
