"""``msgbus status`` output: a table for a terminal (coloured only on a TTY without NO_COLOR), or one JSON
object."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import IO

from client.status import DaemonView, PeerView, RedisView, SiteStatus, UplinkView
from client.status_check import DEGRADED, HEALTHY, Verdict, format_duration

RESET = "\033[0m"
GREEN = "\033[32m"
YELLOW = "\033[33m"
RED = "\033[31m"
BOLD = "\033[1m"
DIM = "\033[2m"
VERDICT_COLOURS = {HEALTHY: GREEN, DEGRADED: YELLOW}
STATE_COLOURS = {"up": GREEN, "down": RED, "probing": YELLOW, "unknown": DIM}

Cell = tuple[str, str]  # text, colour ("" for none)
# Wraps a text in a colour, or leaves it as it is.
Paint = Callable[[str, str], str]


def wants_colour(stream: IO[str], environ: Mapping[str, str]) -> bool:
    """Colour only for a terminal, and never when NO_COLOR is set to anything (https://no-color.org)."""
    return stream.isatty() and not environ.get("NO_COLOR")


def render_json(status: SiteStatus, verdict: Verdict) -> str:
    """One JSON object on one line."""
    return json.dumps(to_json(status, verdict), ensure_ascii=False)


def to_json(status: SiteStatus, verdict: Verdict) -> dict[str, object]:
    daemon, redis = status.daemon, status.redis
    daemon_fields: dict[str, object] = {}
    if daemon is not None:
        daemon_fields = {k: v for k, v in asdict(daemon).items() if k not in ("peers", "traffic", "uplinks")}
    return {
        "status": verdict.word,
        "exit_code": verdict.exit_code,
        "problems": list(verdict.problems),
        "checked_at": round(status.checked_at, 3),
        "daemon": {
            "url": status.site_url,
            "reachable": daemon is not None,
            "error": status.daemon_error or None,
            **daemon_fields,
        },
        "redis": {
            "url": status.redis_url,
            "reachable": redis is not None,
            "error": status.redis_error or None,
            **(_redis_fields(redis) if redis is not None else {}),
        },
        "peers": [asdict(peer) for peer in status.peers],
        "uplinks": [asdict(uplink) for uplink in daemon.uplinks] if daemon is not None else [],
        "traffic": asdict(daemon.traffic) if daemon is not None else None,
    }


def _redis_fields(redis: RedisView) -> dict[str, object]:
    """What Redis holds, and what its memory means: ``full`` (at its maxmemory) and ``evicting`` (its
    policy may delete keys)."""
    return {**asdict(redis), "full": redis.full, "evicting": redis.evicting}


def render_table(status: SiteStatus, verdict: Verdict, *, colour: bool) -> str:
    """The readable report: the site, its queues, its peers, the last minute's traffic, the problems."""
    paint = _painter(colour)
    lines = [*_heading(status, verdict, paint), ""]
    if status.redis is not None:
        lines += [*_queue_lines(status.redis, status.checked_at, paint), ""]
    if status.redis is not None and status.redis.instances:
        lines += [*_instance_lines(status.redis, paint), ""]
    if status.daemon is not None and status.daemon.uplinks:
        lines += [*_uplink_lines(status, status.daemon.uplinks, paint), ""]
    if status.peers:
        lines += [*_peer_lines(status.peers, status.checked_at, paint), ""]
    if status.daemon is not None:
        lines += [*_traffic_lines(status.daemon), ""]
    if verdict.problems:
        problem_colour = RED if verdict.exit_code > DEGRADED else YELLOW
        lines += ["problems", *(paint(f"  - {problem}", problem_colour) for problem in verdict.problems)]
    else:
        lines.append(paint("no problems", GREEN))
    return "\n".join(lines) + "\n"


def _painter(colour: bool) -> Paint:
    def paint(text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if colour and code and text else text

    return paint


def _heading(status: SiteStatus, verdict: Verdict, paint: Paint) -> list[str]:
    daemon, redis = status.daemon, status.redis
    twin = daemon.twin if daemon is not None else redis.twin if redis is not None else None
    title = "msgbus status" + (f": twin {twin}" if twin is not None else "")
    if daemon is not None:
        title += f", msgbusd {daemon.version}, up {format_duration(daemon.uptime_s)}"
    word = f"{verdict.word.upper()} (exit {verdict.exit_code})"
    verdict_colour = VERDICT_COLOURS.get(verdict.exit_code, RED)
    return [
        f"{paint(title, BOLD)}  {paint(word, verdict_colour)}",
        f"  daemon  {status.site_url}  {_daemon_summary(status, daemon, paint)}",
        f"  redis   {status.redis_url}  {_redis_summary(status, redis, paint)}",
    ]


def _daemon_summary(status: SiteStatus, daemon: DaemonView | None, paint: Paint) -> str:
    if daemon is None:
        verb = "NO STATUS REPORT" if status.daemon_answered else "DOES NOT ANSWER"
        return paint(f"{verb}: {status.daemon_error}", RED)
    links = f"{daemon.links_open} link(s) open"
    return f"{paint('answering', GREEN)}; {daemon.inflight} in flight, {links}"


def _redis_summary(status: SiteStatus, redis: RedisView | None, paint: Paint) -> str:
    if redis is None:
        return paint(f"DOES NOT ANSWER: {status.redis_error}", RED)
    limit = f"maxmemory {redis.maxmemory_human}" if redis.maxmemory else "no maxmemory"
    summary = f"{paint('answering', GREEN)}; {redis.used_memory_human} used, {limit}"
    if redis.full:
        summary += f" ({paint('FULL', RED)})"
    if redis.evicting:
        summary += f", {paint(f'maxmemory-policy {redis.maxmemory_policy}', YELLOW)}"
    return summary


def _queue_lines(redis: RedisView, now: float, paint: Paint) -> list[str]:
    rows: list[Sequence[Cell]] = [
        [(queue.name, ""), (str(queue.waiting), ""), (str(queue.processing), "")] for queue in redis.queues
    ]

    def count(label: str, value: int, warn: bool = False) -> list[Cell]:
        return [(label, ""), (str(value), YELLOW if warn and value else ""), ("", "")]

    rows += [
        count("backlog (requests awaiting their outcome)", redis.backlog),
        count("replies being forwarded", redis.replies),
        count("re-sends scheduled", redis.retries_scheduled),
        count("overdue requests", redis.overdue, warn=True),
        count("dead letters", redis.dead_letters),
    ]
    lines = _table(["queue", "waiting", "processing"], rows, right=(1, 2), paint=paint)
    for letter in redis.newest_dead_letters:
        age = f"{format_duration(now - letter.at)} ago" if letter.at is not None else "?"
        lines.append(f"    {age}  {letter.queue}: {letter.reason}")
    return lines


def _instance_lines(redis: RedisView, paint: Paint) -> list[str]:
    """One row per msgbusd process of the site, with the site-wide jobs it holds."""
    jobs: dict[str, list[str]] = {}
    for name, holder in redis.holders.items():
        if not name.isdigit():
            jobs.setdefault(holder, []).append(name)
    rows: list[Sequence[Cell]] = [
        [
            (instance.id, ""),
            ("alive", GREEN) if instance.alive else ("DEAD", RED),
            (f"{format_duration(instance.last_beat_s_ago)} ago", ""),
            (str(instance.leases), ""),
            (f"{instance.sent_per_s:.1f}", ""),
            (f"{instance.received_per_s:.1f}", ""),
            (", ".join(sorted(jobs.get(instance.id, []))), ""),
        ]
        for instance in redis.instances
    ]
    headers = ["process", "state", "last beat", "leases", "sent/s", "received/s", "also runs"]
    return _table(headers, rows, right=(3, 4, 5), paint=paint)


def _peer_lines(peers: Sequence[PeerView], now: float, paint: Paint) -> list[str]:
    """One row per peer; its last error, when it has one, on the line below (errors are long)."""
    rows: list[Sequence[Cell]] = []
    errors: list[str] = []
    for peer in peers:
        since = _since(peer.down_since, now) if peer.down_since is not None else ""
        probe = f"in {peer.next_probe_in_s:.1f}s" if peer.next_probe_in_s is not None else ""
        sent = f"{format_duration(now - peer.last_sent_at)} ago" if peer.last_sent_at else "-"
        rows.append(
            [
                (str(peer.twin), ""),
                (peer.state, STATE_COLOURS.get(peer.state, "")),
                (since, ""),
                (probe, ""),
                ("?" if peer.queue is None else str(peer.queue), ""),
                (sent, ""),
                (peer.sender, ""),
            ]
        )
        age = f" {format_duration(now - peer.last_error_at)} ago" if peer.last_error_at is not None else ""
        errors.append(f"        last error{age}: {peer.last_error}" if peer.last_error else "")
    headers = ["peer", "state", "down since", "next probe", "queue", "last sent", "sent by"]
    header, *lines = _table(headers, rows, right=(0, 4), paint=paint)
    return [
        header,
        *(text for line, error in zip(lines, errors, strict=True) for text in (line, error) if text),
    ]


def _uplink_name(uplink: UplinkView) -> str:
    if uplink.direction != "relay":
        return str(uplink.twin)
    return f"relay {uplink.relay}" + (f" (twin {uplink.twin})" if uplink.twin is not None else "")


def _uplink_queue(uplink: UplinkView, queued: dict[int, int] | None) -> str:
    if uplink.direction == "relay" or uplink.twin is None:
        # The link to this site's relay carries what is sent to many twins.
        return "-"
    return "?" if queued is None else str(queued.get(uplink.twin, 0))


def _uplink_lines(status: SiteStatus, uplinks: Sequence[UplinkView], paint: Paint) -> list[str]:
    """One row per uplink: kept by this site to another ("out"), or opened to it by an edge ("in"), with
    what waits here for that twin."""
    queued = status.redis.send_queues if status.redis is not None else None
    rows: list[Sequence[Cell]] = [
        [
            (_uplink_name(uplink), ""),
            ("the twin" if uplink.direction == "in" else "this site", ""),
            ("open", GREEN) if uplink.open else ("closed", RED),
            (_since(uplink.since, status.checked_at) if uplink.since is not None else "-", ""),
            (_uplink_queue(uplink, queued), ""),
        ]
        for uplink in uplinks
    ]
    return _table(["uplink", "kept by", "state", "since", "queue"], rows, right=(0, 4), paint=paint)


def _traffic_lines(daemon: DaemonView) -> list[str]:
    traffic = daemon.traffic
    p50, p99 = (_ms(value) for value in (traffic.round_trip_p50_s, traffic.round_trip_p99_s))
    round_trips = f"{traffic.round_trips} ({traffic.round_trips_per_s:.2f}/s), p50 {p50}, p99 {p99}"
    return [
        f"traffic, last {traffic.window_s:.0f}s",
        f"  to other sites     {traffic.sent_per_s:.2f} msg/s",
        f"  from other sites   {traffic.received_per_s:.2f} msg/s",
        f"  round trips        {round_trips}",
    ]


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    right: Sequence[int],
    paint: Paint,
) -> list[str]:
    """Columns padded to their widest cell, colour added after padding so escape codes do not count."""
    widths = [max([len(header), *(len(row[i][0]) for row in rows)]) for i, header in enumerate(headers)]

    def line(cells: Sequence[Cell]) -> str:
        padded = [
            paint(text.rjust(widths[i]) if i in right else text.ljust(widths[i]), colour)
            for i, (text, colour) in enumerate(cells)
        ]
        return ("  " + "  ".join(padded)).rstrip()

    return [line([(header, "") for header in headers]), *(line(row) for row in rows)]


def _since(at: float, now: float) -> str:
    shown = time.strftime("%H:%M:%S" if now - at < 86_400 else "%Y-%m-%d %H:%M", time.localtime(at))
    return f"{shown} ({format_duration(now - at)})"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"
