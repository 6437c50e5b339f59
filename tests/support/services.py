"""Services and clients that speak the raw Redis side of RMB the way existing programs do.

``RawService`` behaves like a zos service (BRPOP ``msgbus.<cmd>``, reply to ``msgbus.system.reply`` without a
signature) or, with ``reply_to_ret``, like the npm server (push to the request's ``ret``). It counts how many
times it executed each uid, which is what the tests check for "executed once".
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import redis

from wire import keys
from wire.envelope import Envelope, encode_payload


class RawService(threading.Thread):
    def __init__(
        self,
        redis_url: str,
        cmd: str,
        *,
        handler: Callable[[bytes], bytes] = lambda data: data,
        reply_to_ret: bool = False,
    ) -> None:
        super().__init__(daemon=True, name=f"service {cmd}")
        self.conn = redis.Redis.from_url(redis_url)
        self.cmd = cmd
        self.handler = handler
        self.reply_to_ret = reply_to_ret
        self.executions: Counter[str] = Counter()
        self.payloads: Counter[bytes] = Counter()
        self.requests: list[Envelope] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            item = self.conn.brpop([keys.command_queue(self.cmd)], timeout=0.2)
            if item is None:
                continue
            request = Envelope.decode(item[1])
            self.requests.append(request)
            self.executions[f"{request.src}/{request.uid}"] += 1
            self.payloads[request.payload] += 1
            reply = request.replace(
                src=request.dst[0] if request.dst else 0,
                dst=(request.src,),
                dat=encode_payload(self.handler(request.payload)),
                now=int(time.time()),
                sig="",
            )
            target = request.ret if self.reply_to_ret else keys.REPLY
            self.conn.lpush(target, reply.encode())

    def __enter__(self) -> RawService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self.conn.close()


def push_request(
    conn: redis.Redis,
    dst: list[int],
    cmd: str,
    data: bytes = b"ping",
    *,
    exp: int = 0,
    retries: int = 0,
    rpush: bool = False,
    ret: str | None = None,
) -> str:
    """Push a request as a client does; returns its return queue (a new one unless ``ret`` is given)."""
    ret = ret or str(uuid.uuid4())
    env = Envelope(
        cmd=cmd,
        dst=tuple(dst),
        ret=ret,
        dat=encode_payload(data),
        exp=exp,
        retries=retries,
        now=int(time.time()),
    )
    if rpush:
        conn.rpush(keys.LOCAL, env.encode())
    else:
        conn.lpush(keys.LOCAL, env.encode())
    return ret


def all_answered(conn: redis.Redis, dst: int, cmd: str, count: int) -> bool:
    """Push ``count`` requests for ``cmd`` to twin ``dst``, wait for each reply; True if none is an error."""
    rets = [push_request(conn, [dst], cmd, str(i).encode(), exp=60, retries=5) for i in range(count)]
    return all(pop_replies(conn, ret, 1, timeout_s=30)[0].err == "" for ret in rets)


def pop_replies(conn: redis.Redis, ret: str, count: int, timeout_s: float = 15.0) -> list[Envelope]:
    """Pop ``count`` messages from ``ret`` (in short blocking slices), failing after ``timeout_s``."""
    replies: list[Envelope] = []
    deadline = time.monotonic() + timeout_s
    while len(replies) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"got {len(replies)} of {count} replies on {ret}: {replies}")
        item = conn.blpop([ret], timeout=0.5)
        if item is not None:
            replies.append(Envelope.decode(item[1]))
    return replies
