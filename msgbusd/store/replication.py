"""``--redis-wait-replicas N``: writes the daemon acknowledges count as done only once N replicas of its
Redis have them (Redis ``WAIT`` on the connection that wrote them), so that a failover, which promotes the
replica with the most data, loses none of them.

A master with fewer replicas online than N is waited for by those it has: a write on a master with no
replica cannot be lost to a failover (there is no replica to promote), and a replica that connects later
copies the whole data set before it counts (``ROLE`` lists a replica once it has). Which replicas are online
is read (``ROLE``) after the wait, in the same round trip as the writes: a replica that came online since the
last round trip, and was not waited for, fails the writes, which are tried again and wait for it.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.client import Pipeline
from redis.client import Pipeline as SyncPipeline
from redis.exceptions import RedisError

from wire import keys

# How long a write waits for its replicas before it counts as failed.
WAIT_MS = 2000


class ReplicationError(RedisError):
    """Fewer replicas than required acknowledged writes in time: they may be on the master only."""


class Replication:
    def __init__(self, replicas: int, wait_ms: int = WAIT_MS) -> None:
        self.replicas = replicas
        self.wait_ms = wait_ms
        # Until the master says otherwise, it is taken to have the replicas asked for.
        self._online = replicas

    def queue_on(self, pipe: Pipeline | SyncPipeline) -> int:
        """Queue the wait after the writes queued on ``pipe``, and the reading of the role; returns how many
        replicas are waited for."""
        if not self.replicas:
            return 0
        wanted = min(self.replicas, self._online)
        if wanted:
            # WAIT waits for this connection's last write. One write of its own makes that "everything
            # written so far", so that a batch repeated after a wait fell short (its hand-offs find nothing
            # left to do) still waits for the writes of the first try.
            pipe.execute_command("INCR", keys.REPLICATED)
            pipe.execute_command("WAIT", wanted, self.wait_ms)
        pipe.execute_command("ROLE")
        return wanted

    def check(self, answers: list[Any], wanted: int) -> None:
        """Take the answers :meth:`queue_on` queued off the end of ``answers``; raise
        :class:`ReplicationError` when fewer replicas than the master has online (up to the number asked
        for) have the writes."""
        if not self.replicas:
            return
        role = answers.pop()
        acknowledged = answers.pop() if wanted else 0
        if wanted:
            answers.pop()  # the write of our own
        if isinstance(acknowledged, Exception):
            raise acknowledged
        if isinstance(role, Exception):
            raise role
        self._online = _online_replicas(role)
        needed = min(self.replicas, self._online)
        if wanted < needed:
            raise ReplicationError(
                f"{needed} replica(s) online, {wanted} waited for: the writes are made again and wait for "
                "them (--redis-wait-replicas)"
            )
        if int(acknowledged) < needed:
            raise ReplicationError(
                f"only {acknowledged} of {needed} replica(s) acknowledged the writes within "
                f"{self.wait_ms} ms (--redis-wait-replicas)"
            )


def _online_replicas(role: Any) -> int:
    """The replicas a ``ROLE`` answer lists (a master lists those that have copied its data set)."""
    if not isinstance(role, list) or len(role) < 3:
        return 0
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    return len(role[2]) if kind == "master" else 0
