"""``msgbus backlog dump``: everything pending at a site, as JSON lines (fields: wire.event_schema).

Reads the site's Redis without changing it: the backlog of requests waiting for their reply (with their
deadlines and failed attempts), scheduled re-sends, replies being forwarded, items waiting in the system
queues and their processing lists, and the dead letters. Large hashes and sorted sets are read in chunks
(HSCAN/ZSCAN), so a backlog of millions of entries streams out in bounded memory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, TextIO

from redis import Redis

from wire import event_schema as ev
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError, payload_size
from wire.redis_url import as_text

CHUNK = 1000


def dump(redis: Redis, out: TextIO, now: float | None = None) -> int:
    """Write one line per pending entry to ``out``; returns how many."""
    snapshot = _Snapshot(redis, time.time() if now is None else now)
    written = 0
    for entry in snapshot.entries():
        out.write(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n")
        written += 1
    return written


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1_000_000)


def _destination(uid: str) -> int | None:
    head, _, tail = uid.partition(".")
    return int(head) if head.isdigit() and tail.isdigit() else None


def _envelope(raw: bytes | str) -> Envelope | None:
    try:
        return Envelope.decode(raw)
    except EnvelopeDecodeError:
        return None


class _Snapshot:
    def __init__(self, redis: Redis, now: float) -> None:
        self._redis = redis
        self._now = now
        site = redis.get(keys.SITE_TWIN)
        self._site = int(site) if site is not None else None

    def _entry(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {ev.TAKEN_AT: _micros(self._now), ev.SITE: self._site, ev.KIND: kind}
        entry.update((name, value) for name, value in fields.items() if value is not None)
        return entry

    def _age(self, sent_at: float | None) -> float | None:
        return None if sent_at is None else round(self._now - sent_at, 3)

    def entries(self) -> Iterator[dict[str, Any]]:
        yield from self._requests()
        yield from self._scheduled()
        yield from self._replies()
        yield from self._queued()
        yield from self._dead_letters()

    def _requests(self) -> Iterator[dict[str, Any]]:
        chunk: list[tuple[str, bytes]] = []
        for uid, raw in self._redis.hscan_iter(keys.BACKLOG, count=CHUNK):
            chunk.append((as_text(uid), raw))
            if len(chunk) >= CHUNK:
                yield from self._request_chunk(chunk)
                chunk = []
        yield from self._request_chunk(chunk)

    def _request_chunk(self, chunk: list[tuple[str, bytes]]) -> Iterator[dict[str, Any]]:
        if not chunk:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for uid, _raw in chunk:
                pipe.zscore(keys.DEADLINES, uid)
                pipe.hget(keys.ATTEMPTS, uid)
            answers = iter(pipe.execute())
        for uid, raw in chunk:
            deadline, failures = next(answers), next(answers)
            original = _envelope(raw)
            yield self._entry(
                "request",
                uid=uid,
                cmd=original.cmd if original else None,
                src=original.src if original else None,
                dst=_destination(uid),
                ret=original.ret if original else None,
                age_s=self._age(original.now) if original else None,
                deadline=_micros(deadline),
                attempt=int(failures) if failures is not None else 0,
                bytes=payload_size(original.dat) if original else None,
                error=None if original else "unreadable backlog entry",
            )

    def _scheduled(self) -> Iterator[dict[str, Any]]:
        for member, due in self._redis.zscan_iter(keys.OUTBOX, count=CHUNK):
            name = as_text(member)
            if name.startswith(keys.REQUEST_PREFIX):
                uid = name.removeprefix(keys.REQUEST_PREFIX)
                yield self._entry("retry", uid=uid, dst=_destination(uid), due=_micros(due))

    def _replies(self) -> Iterator[dict[str, Any]]:
        for key, raw in self._redis.hscan_iter(keys.REPLIES, count=CHUNK):
            name = as_text(key)
            state_raw = self._redis.hget(keys.REPLY_STATE, name)
            state = json.loads(state_raw) if state_raw else {}
            due = self._redis.zscore(keys.OUTBOX, keys.REPLY_PREFIX + name)
            reply = _envelope(raw)
            yield self._entry(
                "reply",
                uid=reply.uid if reply else name.partition("|")[2],
                cmd=reply.cmd if reply else None,
                # The request's direction: the reply goes back to the twin that asked.
                src=int(name.partition("|")[0]) if name.partition("|")[0].isdigit() else None,
                dst=reply.src if reply else None,
                age_s=self._age(state.get("first")),
                deadline=_micros(state.get("deadline")),
                due=_micros(due),
                attempt=int(state.get("attempts", 0)),
            )

    def _queued(self) -> Iterator[dict[str, Any]]:
        instances = [as_text(n) for n in self._redis.zrange(keys.INSTANCES, 0, -1)]
        for queue in keys.SYSTEM_QUEUES:
            for name in (queue, *keys.processing_lists(queue, instances)):
                for raw in self._redis.lrange(name, 0, -1):
                    env = _envelope(raw)
                    yield self._entry(
                        "queued",
                        queue=name,
                        uid=env.uid if env else None,
                        cmd=env.cmd if env else None,
                        src=env.src if env else None,
                        dst=env.dst[0] if env and env.dst else None,
                        age_s=self._age(env.now) if env else None,
                        deadline=_micros(env.now + env.lifetime_s) if env else None,
                        error=None if env else "not an envelope",
                    )

    def _dead_letters(self) -> Iterator[dict[str, Any]]:
        for raw in self._redis.lrange(keys.DEAD_LETTER, 0, -1):
            try:
                letter = json.loads(raw)
            except ValueError:
                letter = {}
            yield self._entry(
                "dead_letter",
                queue=letter.get("queue"),
                age_s=self._age(letter.get("at")),
                error=letter.get("reason"),
            )
