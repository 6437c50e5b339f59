"""What a site's Redis does when its memory runs out, as msgbusd and ``msgbus status`` both read and say it.

Under ``maxmemory-policy noeviction`` a full Redis refuses writes, and the bus keeps what it holds; under
any other policy it deletes keys to make room, queued messages among them. Both sides read the policy from
``INFO memory`` (which answers where ``CONFIG`` is disabled or renamed) and warn in the same words, so that
``msgbus status``, which reads the policy afresh, can tell the daemon's warning (read up to seconds ago) from
the rest and say its own instead.
"""

from __future__ import annotations

from collections.abc import Mapping

# The one policy under which Redis never deletes a key to make room.
NO_EVICTION = "noeviction"


def maxmemory_policy(info: Mapping[str, object]) -> str | None:
    """The policy an ``INFO memory`` answer names, or None when it names none."""
    policy = info.get("maxmemory_policy")
    if isinstance(policy, bytes):
        policy = policy.decode(errors="replace")
    return str(policy) if policy else None


def evicting_policy_warning(redis_url: str, policy: str) -> str:
    """What to say of the Redis at ``redis_url`` (redacted) whose policy ``policy`` is not noeviction."""
    return (
        f"{policy_warning_start(redis_url)}{policy}: under memory pressure it may drop queued messages; set "
        f"maxmemory-policy {NO_EVICTION} (redis.conf or CONFIG SET)"
    )


def policy_warning_start(redis_url: str) -> str:
    """How every :func:`evicting_policy_warning` of the Redis at ``redis_url`` starts, whatever the policy."""
    return f"Redis at {redis_url} has maxmemory-policy "
