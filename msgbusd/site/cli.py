"""``msgbusd``: parse go-rmb's flags (and ours) into :class:`Settings`, then run the site."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_type_hints
from urllib.parse import urlsplit

import typer

from msgbusd.errors import StartupError
from msgbusd.reports.logs import configure_logging
from msgbusd.site.companions import installed
from msgbusd.site.settings import DEFAULT_REDIS_URL, DEFAULT_SUBSTRATE_URL, Settings
from wire.envelope import DEFAULT_MAX_MESSAGE_BYTES

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "panic": logging.CRITICAL,
}


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` with ``[v6]:PORT`` for IPv6; ``[::]:8051`` listens on every IPv4 and IPv6 address."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (for IPv6: [ADDR]:PORT)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise typer.BadParameter(f"{value!r}: write an IPv6 address in brackets, e.g. [::]:8051")
    return host or "::", int(port_text)


def parse_mqtt_url(value: str) -> tuple[str, int]:
    """``mqtt://HOST[:PORT]`` (port 1883 by default) as (host, port)."""
    parts = urlsplit(value)
    try:
        port = parts.port or 1883
    except ValueError:
        port = 0
    if parts.scheme != "mqtt" or not parts.hostname or not port or parts.path not in ("", "/"):
        raise typer.BadParameter(f"{value!r} is not mqtt://HOST:PORT")
    return parts.hostname, port


def read_secret_file(path: Path) -> str:
    """The secret in ``path``; refused when every user of the machine can read the file."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    if mode & stat.S_IROTH:
        raise typer.BadParameter(
            f"{path} is readable by every user; keep the secret private: chmod o-r {path}"
        )
    if not text:
        raise typer.BadParameter(f"{path} is empty")
    return text


def site_settings(
    mnemonics: Annotated[
        str | None,
        typer.Option(
            envvar="MSGBUS_MNEMONICS",
            show_envvar=True,
            help="The site's secret: BIP39 phrase, SURI with //hard junctions, or 0x seed.",
        ),
    ] = None,
    mnemonics_file: Annotated[
        Path | None,
        typer.Option(help="Read the secret from this file (not readable by other users) instead."),
    ] = None,
    key_type: Annotated[str, typer.Option(help="sr25519 or ed25519.")] = "sr25519",
    twin: Annotated[
        int | None, typer.Option(help="This site's twin id; looked up from the key when omitted.")
    ] = None,
    substrate: Annotated[
        str,
        typer.Option(
            help="Where twins are looked up: TFChain (ws:// or wss://) or an HTTP twin source (http(s)://, "
            "GET /twin/{id}). Not used with --twins."
        ),
    ] = DEFAULT_SUBSTRATE_URL,
    twin_cache_ttl: Annotated[
        float, typer.Option(min=0.0, help="Seconds a twin looked up on the chain or HTTP source is kept.")
    ] = 300.0,
    twin_stale_for: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="While the twin source is unreachable, serve the last known answer this much longer.",
        ),
    ] = 3600.0,
    twin_lookup_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds one look-up on the chain or HTTP source may take.")
    ] = 10.0,
    twins: Annotated[
        Path | None, typer.Option(help="Static twin map (JSON); used instead of the chain.")
    ] = None,
    redis: Annotated[
        str,
        typer.Option(
            help="The site's Redis: redis://, rediss://, unix://, or through Redis Sentinel: "
            "redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]."
        ),
    ] = DEFAULT_REDIS_URL,
    redis_wait_replicas: Annotated[
        int,
        typer.Option(
            min=0,
            help="Acknowledge a hand-off (a local request accepted, a message taken at the door, a reply "
            "recorded) only once this many replicas of the site's Redis have it (Redis WAIT), so that a "
            "failover loses none; 0: once the master has it.",
        ),
    ] = 0,
    listen: Annotated[str, typer.Option(help="HTTP address for other sites.")] = "[::]:8051",
    workers: Annotated[
        int, typer.Option(min=1, help="Destination twins sent to at once (the others wait for a turn).")
    ] = 1000,
    redis_connections: Annotated[
        int,
        typer.Option(
            min=4,
            help="Connections to the site's Redis for the daemon's own work (they wait for a free one), and "
            "as many again for the HTTP door.",
        ),
    ] = 64,
    probe_interval: Annotated[
        float,
        typer.Option(
            min=0.01, help="Seconds between probes of a twin that does not answer (up to twice that)."
        ),
    ] = 1.0,
    probe_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Probes of all the twins that do not answer, at most this many a second (0: no bound); "
            "with many down, each is probed less often.",
        ),
    ] = 50.0,
    log_level: Annotated[str, typer.Option(help="debug|info|warn|error|fatal|panic.")] = "info",
    send_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a POST to a peer may take.")] = 10.0,
    retry_delay: Annotated[
        float,
        typer.Option(min=0.0, help="Seconds before the first re-send of a failed message (then doubling)."),
    ] = 5.0,
    retry_max_delay: Annotated[float, typer.Option(min=0.0, help="Longest delay between re-sends.")] = 60.0,
    hold_offline: Annotated[
        bool,
        typer.Option(
            "--hold-offline",
            help="Keep messages to an unreachable twin, without spending their tries, until it is back "
            "(they still expire).",
        ),
    ] = False,
    drain_grace: Annotated[
        float, typer.Option(min=0.0, help="Seconds in-flight work gets on SIGTERM.")
    ] = 10.0,
    links: Annotated[
        bool,
        typer.Option(
            "--links/--no-links",
            help="Carry messages to and from other msgbus sites over one WebSocket per peer (--no-links: "
            "one POST per batch, as to go-rmb sites, and upgrades are refused).",
        ),
    ] = True,
    link_ping: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a link this site opened may be silent before its connection is checked (by the "
            "kernel, answered however busy the other site is); one found dead is closed within about as "
            "long again, and the link opened again.",
        ),
    ] = 5.0,
    link_handshakes: Annotated[
        float,
        typer.Option(
            min=1,
            help="Links other sites open that this site lets begin each second, at most: a herd of edges "
            "coming back at once is let in in turns (503, Retry-After: when to dial again).",
        ),
    ] = 1000.0,
    link_idle: Annotated[
        float,
        typer.Option(
            min=0.1, help="Close a link that carried no message for this many seconds (opened again on need)."
        ),
    ] = 300.0,
    link_after: Annotated[
        int,
        typer.Option(
            min=1,
            help="Open a link to a twin once this many messages go to it at once, or it is sent one "
            "within 10 s of the last (1: at its first message); until then they go in POSTs.",
        ),
    ] = 2,
    large_message_bytes: Annotated[
        int,
        typer.Option(
            min=0,
            help="A message with a larger payload is sent beside the others, not in front of them: smaller "
            "messages queued after it do not wait for it (and may arrive first); 0: every message in order.",
        ),
    ] = 65536,
    max_links: Annotated[
        int,
        typer.Option(
            min=1, help="Links open at once at most; the least recently used one is closed to open another."
        ),
    ] = 4096,
    uplink: Annotated[
        list[int] | None,
        typer.Option(
            min=1,
            help="Keep a link open to this twin's site (repeatable), dialed again when it breaks: that site "
            "sends everything for this twin over it, so this site needs no address it can be dialed at.",
        ),
    ] = None,
    relay: Annotated[
        bool,
        typer.Option(
            "--relay",
            help="Relay for other twins: take links from the twins whose entry names a relay, and keep what "
            "other sites send them (encrypted for them) until it can go over those links.",
        ),
    ] = False,
    max_message_size: Annotated[
        int,
        typer.Option(
            min=1024,
            help="The largest message payload (bytes): larger HTTP bodies (beyond its base64 envelope), REST "
            "bodies and MQTT payloads are refused with 413.",
        ),
    ] = DEFAULT_MAX_MESSAGE_BYTES,
    rate_limit: Annotated[
        float,
        typer.Option(min=0.0, help="Messages per second accepted from one source twin (429 beyond); 0: off."),
    ] = 0.0,
    rate_burst: Annotated[
        float, typer.Option(min=1.0, help="Messages a source twin may send at once above --rate-limit.")
    ] = 100.0,
    event_log: Annotated[
        Path | None,
        typer.Option(help="Directory for the event log (JSON lines of every step of every message)."),
    ] = None,
    event_log_max_mb: Annotated[
        int, typer.Option(min=1, help="Start a new event log file when the current one reaches this size.")
    ] = 64,
    event_log_rotate_minutes: Annotated[
        float | None, typer.Option(min=0.1, help="Start a new event log file after this long (default 60).")
    ] = None,
    event_log_rotate_seconds: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="The same in seconds, for a reader that follows the log as it is written, e.g. 10.",
        ),
    ] = None,
    instance: Annotated[
        str | None,
        typer.Option(
            help="This process's name among the site's processes (same identity and --redis); default "
            "HOST:PID."
        ),
    ] = None,
    instance_lease: Annotated[
        float,
        typer.Option(
            min=0.5,
            help="Seconds after its last heartbeat before a process of the site that stopped is taken over "
            "by the others (one on the same machine is taken over as soon as its process is gone).",
        ),
    ] = 5.0,
    reuse_port: Annotated[
        bool,
        typer.Option(
            "--reuse-port",
            help="Listen with SO_REUSEPORT, so that the site's processes on this machine share --listen.",
        ),
    ] = False,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Run this many processes of the site, sharing --listen (--reuse-port), under this one, "
            "which starts again one that dies and passes SIGTERM on to all.",
        ),
    ] = 1,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            help="Also serve this process's /metrics, /healthz and /status on HOST:PORT, to whoever can "
            "reach it (the site's address serves them to loopback only, from any of its processes); with "
            "--processes N, the processes take PORT, PORT+1, ... PORT+N-1.",
        ),
    ] = None,
) -> Settings:
    """Run a msgbus site: relay RMB messages between this site's Redis and other sites over HTTP."""
    level = LOG_LEVELS.get(log_level.lower())
    if level is None:
        raise typer.BadParameter(f"unknown log level {log_level!r}: use {', '.join(LOG_LEVELS)}")
    if mnemonics_file is not None:
        if mnemonics:
            raise typer.BadParameter("give the secret once: --mnemonics-file or --mnemonics/MSGBUS_MNEMONICS")
        mnemonics = read_secret_file(mnemonics_file)
    if not mnemonics:
        raise typer.BadParameter(
            "missing --mnemonics (or the MSGBUS_MNEMONICS environment variable, or --mnemonics-file)"
        )
    if event_log_rotate_minutes is not None and event_log_rotate_seconds is not None:
        raise typer.BadParameter("give --event-log-rotate-minutes or --event-log-rotate-seconds, not both")
    if event_log_rotate_seconds is None:
        event_log_rotate_seconds = 60 * (
            60.0 if event_log_rotate_minutes is None else event_log_rotate_minutes
        )
    host, port = parse_listen(listen)
    uplinks = tuple(dict.fromkeys(uplink or ()))
    if uplinks and not links:
        raise typer.BadParameter("--uplink needs links (drop --no-links)")
    if twin in uplinks:
        raise typer.BadParameter(f"--uplink {twin} is this site's own twin")
    if relay and not links:
        raise typer.BadParameter("--relay needs links (drop --no-links)")
    settings = Settings(
        mnemonics=mnemonics,
        key_type=key_type,
        twin=twin,
        substrate_url=substrate,
        twins_file=twins,
        twin_cache_ttl_s=twin_cache_ttl,
        twin_stale_for_s=twin_stale_for,
        twin_lookup_timeout_s=twin_lookup_timeout,
        redis_url=redis,
        redis_wait_replicas=redis_wait_replicas,
        listen_host=host,
        listen_port=port,
        workers=workers,
        redis_connections=redis_connections,
        probe_interval_s=probe_interval,
        probe_rate=probe_rate,
        log_level=log_level,
        send_timeout_s=send_timeout,
        retry_delay_s=retry_delay,
        retry_max_delay_s=retry_max_delay,
        drain_grace_s=drain_grace,
        hold_offline=hold_offline,
        links=links,
        link_ping_s=link_ping,
        link_handshakes_per_s=link_handshakes,
        link_idle_s=link_idle,
        max_links=max_links,
        uplinks=uplinks,
        relay=relay,
        link_after=link_after,
        large_message_bytes=large_message_bytes,
        max_message_bytes=max_message_size,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        event_log_dir=event_log,
        event_log_max_bytes=event_log_max_mb * 1024 * 1024,
        event_log_rotate_s=event_log_rotate_seconds,
        instance=instance,
        instance_lease_s=instance_lease,
        reuse_port=reuse_port,
        processes=processes,
        metrics_listen=parse_listen(metrics_listen) if metrics_listen else None,
    )
    configure_logging(level)
    return settings


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (it is with the daemon extra on Linux), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def command() -> typer.Typer:
    """The ``msgbusd`` command: the daemon's options and those of the installed companions."""
    plugins = installed()
    parameters = list(inspect.signature(site_settings, eval_str=True).parameters.values())
    hints = get_type_hints(site_settings, include_extras=True)
    for plugin in plugins:
        parameters += inspect.signature(plugin.options, eval_str=True).parameters.values()
        hints |= get_type_hints(plugin.options, include_extras=True)
    names = [list(inspect.signature(plugin.options).parameters) for plugin in plugins]

    def run_site(**values: Any) -> None:
        own = [{name: values.pop(name) for name in plugin_names} for plugin_names in names]
        settings = site_settings(**values)
        try:
            made = [
                plugin.make(own_values, settings) for plugin, own_values in zip(plugins, own, strict=True)
            ]
        except StartupError as exc:
            raise SystemExit(f"msgbusd: error: {exc}") from None
        if settings.processes > 1:
            if any(companion is not None for companion in made):
                raise SystemExit(
                    "msgbusd: error: the rules router runs in one process: give it a msgbusd of its own, "
                    "without --processes"
                )
            from msgbusd.site.supervisor import supervise

            raise SystemExit(supervise(sys.argv[1:], settings.processes))
        from msgbusd.site.runner import run

        with (
            contextlib.suppress(KeyboardInterrupt),
            asyncio.Runner(loop_factory=_event_loop_factory()) as runner,
        ):
            runner.run(run(settings, [companion for companion in made if companion is not None]))

    run_site.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run_site.__annotations__ = hints | {"return": None}
    run_site.__doc__ = site_settings.__doc__
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command()(run_site)
    return app


def main() -> None:
    command()(prog_name="msgbusd")
