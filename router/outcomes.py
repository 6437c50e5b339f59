"""Counting what happened to routed messages, in the cloud site's Redis (asyncio; keys in ``keys``).

Each message is counted once: a message sent to an edge has a *pending* record, and only the one who
deletes that record (the reply, the caller's timeout, or a newer keyed message) counts the outcome, in the
same script. Failures keep their error, with the time, among the rule's latest errors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis

from msgbusd.store.script_batch import ScriptBatch
from router import keys


class Outcome(StrEnum):
    SUCCESS = "success"
    FAIL = "fail"
    SUPERSEDED = "superseded"


@dataclass(frozen=True)
class Pending:
    """A message sent to an edge whose outcome is not counted yet."""

    rule: str
    twin: int
    key: str = ""  # X-Msgbus-Key, if any

    def encode(self) -> str:
        return json.dumps({"rule": self.rule, "twin": self.twin, "key": self.key})

    @classmethod
    def decode(cls, raw: bytes | str) -> Pending:
        data: dict[str, Any] = json.loads(raw)
        return cls(str(data["rule"]), int(data.get("twin", 0)), str(data.get("key", "")))


# The rule is only known from the record, so the scripts build the rule's keys from their prefixes (the
# router's keys all live in one Redis, never a cluster).

# Counts an outcome into the rule's counters and latest errors. ARGV: rule, field, error entry ("" for none).
_COUNT = """
local function count(rule, field, entry)
  redis.call('HINCRBY', ARGV[1] .. rule, field, 1)
  if entry ~= '' then
    redis.call('LPUSH', ARGV[2] .. rule, entry)
    redis.call('LTRIM', ARGV[2] .. rule, 0, tonumber(ARGV[3]) - 1)
  end
end
"""

# KEYS: pending record, early outcome. ARGV: counters prefix, errors prefix, errors kept, record, ttl.
# Returns 1 when the outcome had already arrived (and is counted now), else 0.
_EXPECT = (
    _COUNT
    + """
local early = redis.call('GET', KEYS[2])
if early then
  redis.call('DEL', KEYS[2])
  local outcome = cjson.decode(early)
  count(cjson.decode(ARGV[4])['rule'], outcome['field'], outcome['entry'])
  return 1
end
redis.call('SET', KEYS[1], ARGV[4], 'EX', tonumber(ARGV[5]))
return 0
"""
)

# KEYS: pending record, early outcome. ARGV: counters prefix, errors prefix, errors kept, outcome field, error
# entry ("" for none), raw item to ack ("" for none), its processing list, "1" to keep the outcome when the
# record is not there yet. Returns the record when this call counted the outcome.
_SETTLE = (
    _COUNT
    + """
if ARGV[6] ~= '' then redis.call('LREM', ARGV[7], 1, ARGV[6]) end
local record = redis.call('GET', KEYS[1])
if not record then
  if ARGV[8] == '1' then
    redis.call('SET', KEYS[2], cjson.encode({field = ARGV[4], entry = ARGV[5]}), 'EX', 60)
  end
  return false
end
redis.call('DEL', KEYS[1])
count(cjson.decode(record)['rule'], ARGV[4], ARGV[5])
return record
"""
)


class Outcomes:
    """Counters and pending records of the rules router."""

    def __init__(
        self,
        redis: aioredis.Redis,
        clock: Callable[[], float] = time.time,
        keep_errors: int = keys.LAST_ERRORS_KEPT,
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._keep_errors = keep_errors
        self._expect = redis.register_script(_EXPECT)
        self._settle = redis.register_script(_SETTLE)

    async def expect(self, uid: str, pending: Pending, lifetime_s: float) -> None:
        """Remember a message just sent (by its bus uid) until its outcome is counted or it is long gone.

        Its reply may already be there (it is sent before this runs): then it is counted now.
        """
        ttl = int(lifetime_s) + keys.PENDING_MARGIN_S
        await self._expect(keys=self._keys(uid), args=[*self._prefixes(), pending.encode(), ttl])

    async def expect_many(self, messages: list[tuple[str, Pending, float]]) -> list[None]:
        """:meth:`expect` for many messages (uid, pending, lifetime) in one round trip."""
        batch = ScriptBatch(self._redis)
        for uid, pending, lifetime_s in messages:
            ttl = int(lifetime_s) + keys.PENDING_MARGIN_S
            batch.script(self._expect, self._keys(uid), [*self._prefixes(), pending.encode(), ttl])
        await batch.run()
        return [None] * len(messages)

    async def settle_replies(self, processing: str, replies: list[tuple[bytes, str, Outcome, str]]) -> None:
        """Count the outcomes that replies (raw, uid, outcome, error) bring, and acknowledge the replies,
        in one round trip."""
        batch = ScriptBatch(self._redis)
        for raw, uid, outcome, error in replies:
            args = [*self._prefixes(), outcome.value, self._error_entry(error), raw, processing, "1"]
            batch.script(self._settle, self._keys(uid), args)
        await batch.run()

    async def settle(
        self,
        uid: str,
        outcome: Outcome,
        error: str = "",
        *,
        ack: tuple[str, bytes] | None = None,
        from_reply: bool = False,
    ) -> Pending | None:
        """Count the outcome of a pending message once; None if it was already counted (or unknown).

        ``ack`` (processing list, raw item) is removed in the same script, whatever the answer. An outcome
        ``from_reply`` that finds no record is kept a minute, for the sender that is about to write it.
        """
        processing, raw = ack if ack is not None else ("", b"")
        record = await self._settle(
            keys=self._keys(uid),
            args=[
                *self._prefixes(),
                outcome.value,
                self._error_entry(error),
                raw,
                processing,
                "1" if from_reply else "0",
            ],
        )
        return None if record is None else Pending.decode(record)

    @staticmethod
    def _keys(uid: str) -> list[str]:
        return [keys.pending(uid), keys.early_outcome(uid)]

    def _prefixes(self) -> list[str | int]:
        return [keys.counters(""), keys.last_errors(""), self._keep_errors]

    async def count(self, rule: str, outcome: Outcome, error: str = "") -> None:
        """Count one message of ``rule`` that had no pending record (handled where it was received)."""
        await self.count_many([(rule, outcome, error)])

    async def count_many(self, outcomes: list[tuple[str, Outcome, str]]) -> list[None]:
        """:meth:`count` for many messages (rule, outcome, error), in one round trip."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for rule, outcome, error in outcomes:
                pipe.hincrby(keys.counters(rule), outcome.value, 1)
                if error:
                    pipe.lpush(keys.last_errors(rule), self._error_entry(error))
                    pipe.ltrim(keys.last_errors(rule), 0, self._keep_errors - 1)
            await pipe.execute()
        return [None] * len(outcomes)

    async def retried(self, rule: str, error: str) -> None:
        """Note a failed attempt that will be tried again (counted apart from the message's outcome)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.counters(rule), "retries", 1)
            pipe.lpush(keys.last_errors(rule), self._error_entry(error))
            pipe.ltrim(keys.last_errors(rule), 0, self._keep_errors - 1)
            await pipe.execute()

    def _error_entry(self, error: str) -> str:
        if not error:
            return ""
        return json.dumps({"at": self._clock(), "error": error}, ensure_ascii=False)
