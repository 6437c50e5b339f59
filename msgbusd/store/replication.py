"""``--redis-wait-replicas N``: writes the daemon acknowledges count as done only once N replicas of its
Redis have them (Redis ``WAIT`` on the connection that wrote them), so that a failover, which promotes the
replica with the most data, loses none of them.

A master with fewer replicas connected than N is waited for by those it has: a write on a master with no
replica cannot be lost to a failover (there is no replica to promote), and a replica that connects later
copies the whole data set before it counts. Which replicas are connected is read (``ROLE``) in the same
round trip as the writes, at most once a second, and again at once after a wait fell short.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from wire import keys

# How long a write waits for its replicas before it counts as failed.
WAIT_MS = 2000
ROLE_EVERY_S = 1.0


class ReplicationError(RedisError):
    """Fewer replicas than required acknowledged writes in time: they may be on the master only."""


class Replication:
    def __init__(
        self, replicas: int, wait_ms: int = WAIT_MS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.replicas = replicas
        self.wait_ms = wait_ms
        self._clock = clock
        self._connected = replicas
        self._role_due = 0.0

    def queue_on(self, pipe: Pipeline) -> tuple[bool, int]:
        """Queue the reading of the role (when due) and the wait after writes queued on ``pipe``; returns
        whether the role was asked and how many replicas are waited for."""
        if not self.replicas:
            return False, 0
        ask_role = self._clock() >= self._role_due
        if ask_role:
            self._role_due = self._clock() + ROLE_EVERY_S
            pipe.execute_command("ROLE")
        wanted = min(self.replicas, self._connected)
        if wanted:
            # WAIT waits for this connection's last write. One write of its own makes that "everything
            # written so far", so that a batch repeated after a wait fell short (its hand-offs find nothing
            # left to do) still waits for the writes of the first try.
            pipe.execute_command("INCR", keys.REPLICATED)
            pipe.execute_command("WAIT", wanted, self.wait_ms)
        return ask_role, wanted

    def check(self, answers: list[Any], asked_role: bool, wanted: int) -> None:
        """Take the answers :meth:`queue_on` queued off the end of ``answers``; raise
        :class:`ReplicationError` when fewer replicas than waited for have the writes."""
        acknowledged = answers.pop() if wanted else 0
        if wanted:
            answers.pop()  # the write of our own
        role = answers.pop() if asked_role else None
        if isinstance(role, list) and role:
            is_master = str(role[0].decode() if isinstance(role[0], bytes) else role[0]) == "master"
            self._connected = len(role[2]) if is_master and len(role) > 2 else 0
        if isinstance(acknowledged, Exception):
            raise acknowledged
        if int(acknowledged) < wanted:
            self._role_due = 0.0
            raise ReplicationError(
                f"only {acknowledged} of {wanted} replica(s) acknowledged the writes within "
                f"{self.wait_ms} ms (--redis-wait-replicas)"
            )
