"""The replies to many requests pushed at one site, each on its own return queue."""

from __future__ import annotations

import threading
import time

import redis

from tests.support.services import push_request
from wire.envelope import Envelope


class Answers:
    """Collects the replies on many return queues of one site."""

    def __init__(self, url: str) -> None:
        self.conn = redis.Redis.from_url(url)
        self.lock = threading.Lock()
        self.rets: dict[str, bytes] = {}
        self.replies: dict[str, list[Envelope]] = {}
        self.answered_at: dict[str, float] = {}

    def push(self, dst: int, cmd: str, payload: bytes, retries: int = 8) -> str:
        ret = push_request(self.conn, [dst], cmd, payload, exp=90, retries=retries)
        with self.lock:
            self.rets[ret] = payload
        return ret

    def collect(self) -> None:
        with self.lock:
            waiting = [ret for ret in self.rets if ret not in self.replies]
        for start in range(0, len(waiting), 100):
            item = self.conn.blpop(waiting[start : start + 100], timeout=0.05)
            if item is not None:
                ret = item[0].decode()
                self.replies.setdefault(ret, []).append(Envelope.decode(item[1]))
                self.answered_at.setdefault(ret, time.monotonic())

    def done(self) -> bool:
        self.collect()
        return len(self.replies) == len(self.rets)

    def extra(self) -> int:
        """Replies beyond the first of each request, still queued or already taken."""
        queued = sum(int(self.conn.llen(ret)) for ret in self.rets)
        return queued + sum(len(replies) - 1 for replies in self.replies.values())

    def first_replies(self) -> dict[str, tuple[str, bytes]]:
        """Each request's first reply: its error and its payload."""
        return {ret: (replies[0].err, replies[0].payload) for ret, replies in self.replies.items()}

    def echoed(self, prefix: bytes) -> dict[str, tuple[str, bytes]]:
        """What :meth:`first_replies` is when every request was answered by a service that echoes after
        ``prefix``."""
        return {ret: ("", prefix + payload) for ret, payload in self.rets.items()}
