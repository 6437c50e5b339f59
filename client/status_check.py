"""Whether a site is healthy, from what ``msgbus status`` found: its problems in plain words, and the exit
status scripts act on.

- 0 healthy: Redis and the daemon answer, and nothing below is wrong.
- 1 degraded: the site works, but a peer is down, the daemon reports a problem (a loop stuck, its Redis
  away) or warns of something to act on (an event log it cannot write, a peer's clock off), requests are
  past their deadline with no outcome, items were dead-lettered lately, Redis is full or near its memory
  limit, Redis may evict keys (its maxmemory-policy is not noeviction), or the daemon and Redis belong to
  different twins.
- 2 unreachable: Redis or the daemon does not answer. Without the daemon nothing is sent, received or
  delivered, so a site whose daemon is down is unreachable even though its Redis still shows what waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from client.status import OVERDUE_GRACE_S, RedisView, SiteStatus
from wire.redis_memory import evicting_policy_warning, policy_warning_start

HEALTHY = 0
DEGRADED = 1
UNREACHABLE = 2
VERDICTS = {HEALTHY: "healthy", DEGRADED: "degraded", UNREACHABLE: "unreachable"}

# A dead letter this recent makes the site degraded (as the MsgbusDeadLettersGrowing alert).
RECENT_DEAD_LETTER_S = 900.0
# Redis using this share of its maxmemory or more makes the site degraded: at the limit, writes fail.
MEMORY_WARNING_SHARE = 0.9


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    problems: tuple[str, ...]

    @property
    def word(self) -> str:
        return VERDICTS[self.exit_code]


def assess(status: SiteStatus) -> Verdict:
    """The site's problems, worst first, and its exit status."""
    unreachable = []
    if status.redis_error:
        unreachable.append(f"Redis at {status.redis_url} does not answer: {status.redis_error}")
    if status.daemon_error and status.daemon_answered:
        unreachable.append(f"the daemon gave no status report: {status.daemon_error}")
    elif status.daemon_error:
        unreachable.append(
            f"the daemon does not answer ({status.daemon_error}): nothing is sent, received or delivered "
            "at this site until it is back"
        )
    degraded = [
        *_memory_problems(status),
        *_fresher_than_the_daemon(_daemon_problems(status), status),
        *_uplink_problems(status),
        *_peer_problems(status),
        *_redis_problems(status),
    ]
    code = UNREACHABLE if unreachable else DEGRADED if degraded else HEALTHY
    return Verdict(code, (*unreachable, *degraded))


def _daemon_problems(status: SiteStatus) -> list[str]:
    daemon, redis = status.daemon, status.redis
    if daemon is None:
        return []
    problems = [f"the daemon reports: {problem}" for problem in daemon.problems]
    problems += daemon.warnings
    if redis is not None and redis.twin is not None and redis.twin != daemon.twin:
        problems.append(
            f"the daemon is twin {daemon.twin} but this Redis was last used by twin {redis.twin}: "
            "--site and --redis name different sites"
        )
    return problems


def _fresher_than_the_daemon(problems: list[str], status: SiteStatus) -> list[str]:
    """``problems`` without the daemon's word on its Redis's maxmemory-policy (read up to 10 s ago) when
    Redis answered here: :func:`_memory_problems` says what the policy is now."""
    if status.redis is None:
        return problems
    said_here = policy_warning_start(status.redis_url)
    return [problem for problem in problems if not problem.startswith(said_here)]


def _uplink_problems(status: SiteStatus) -> list[str]:
    """An uplink that is closed: this site cannot be reached by that twin's site, or that twin by this one."""
    if status.daemon is None:
        return []
    queued = status.redis.send_queues if status.redis is not None else {}
    problems = []
    for uplink in status.daemon.uplinks:
        if uplink.open:
            continue
        since = f" for {format_duration(status.checked_at - uplink.since)}" if uplink.since else ""
        waiting = (
            f"; {queued[uplink.twin]} message(s) wait for it"
            if uplink.twin is not None and queued.get(uplink.twin)
            else ""
        )
        if uplink.direction == "relay":
            problems.append(
                f"the link to the relay at {uplink.relay} is closed{since}: other sites cannot reach this one"
            )
        elif uplink.direction == "out":
            problems.append(
                f"the uplink to twin {uplink.twin} is closed{since}: its site cannot reach this one"
            )
        else:
            problems.append(f"twin {uplink.twin}'s uplink is closed{since}{waiting}")
    return problems


def _peer_problems(status: SiteStatus) -> list[str]:
    problems = []
    for peer in status.peers:
        if peer.state != "down":
            continue
        since = f" for {format_duration(status.checked_at - peer.down_since)}" if peer.down_since else ""
        waiting = f"; {peer.queue} message(s) wait for it" if peer.queue else ""
        problems.append(f"twin {peer.twin} is down{since}: {peer.cause}{waiting}")
    return problems


def _redis_problems(status: SiteStatus) -> list[str]:
    redis = status.redis
    if redis is None:
        return []
    problems = []
    if redis.overdue:
        problems.append(
            f"{redis.overdue} request(s) more than {OVERDUE_GRACE_S:g}s past their deadline have no outcome: "
            "the daemon's expiry timer is not answering them"
        )
    newest = redis.newest_dead_letters[0] if redis.newest_dead_letters else None
    if newest is not None and newest.at is not None and status.checked_at - newest.at < RECENT_DEAD_LETTER_S:
        problems.append(
            f"an item was dead-lettered {format_duration(status.checked_at - newest.at)} ago "
            f"({newest.queue}: {newest.reason})"
        )
    for instance in redis.instances:
        if not instance.alive:
            silent = format_duration(instance.last_beat_s_ago)
            problems.append(
                f"msgbusd process {instance.id} has not beaten for {silent}: the site's other processes "
                "take its work over"
            )
    return problems


def _memory_problems(status: SiteStatus) -> list[str]:
    """A Redis that is full or nearly, and one that may evict queued messages: first, as nothing new gets
    through a full one."""
    redis = status.redis
    if redis is None:
        return []
    problems = []
    if redis.full:
        problems.append(_full(redis))
    elif redis.maxmemory and redis.used_memory >= MEMORY_WARNING_SHARE * redis.maxmemory:
        share = redis.used_memory / redis.maxmemory
        problems.append(f"Redis uses {share:.0%} of its maxmemory: at the limit it refuses writes")
    if redis.evicting:
        problems.append(evicting_policy_warning(status.redis_url, redis.maxmemory_policy))
    return problems


def _full(redis: RedisView) -> str:
    used = f"{redis.used_memory_human} used, maxmemory {redis.maxmemory_human}"
    if redis.evicting:
        return f"Redis is full ({used}): it evicts keys to make room, queued messages among them"
    return (
        f"Redis is full ({used}): it refuses new messages (local requests, messages from other sites, "
        "replies) until memory is freed or maxmemory is raised"
    )


def format_duration(seconds: float) -> str:
    """``42s``, ``3m12s``, ``2h05m``, ``3d04h``: two units at most."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
