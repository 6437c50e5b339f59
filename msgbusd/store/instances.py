"""The Redis side of a site of several daemon processes (instances): heartbeats, who holds which lease, and
taking over what a dead instance held. Every step is one script, timed by Redis's clock, so instances on
machines whose clocks differ agree on who is alive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from msgbusd.store.leases import Notice
from wire import keys
from wire.redis_url import as_text

# Records a heartbeat of ARGV[1] and what it says of itself; returns whether it was in the instances set
# (0: first beat, or another instance took it for dead), Redis's time, every instance with its last beat, and
# the version of the uplinks' hash. KEYS: instances, the instance's info, the uplinks' version. ARGV: id,
# info TTL seconds, then field/value pairs.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local present = redis.call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
redis.call('ZADD', KEYS[1], now, ARGV[1])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[2], ARGV[2])
local version = redis.call('GET', KEYS[3]) or '0'
return {present, tostring(now), redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), version}
"""

# Takes over a dead instance unless it beat after ARGV[2]: moves each of its processing lists back to the head
# of its queue, in order, and removes it. Its leases are free from then on (their holder is not live).
# KEYS: instances, its info, then (queue, its processing list) pairs. ARGV: id, latest beat it may have had.
# Returns the items moved, or -1 when it was alive after all.
_BURY = """
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if beat and tonumber(beat) > tonumber(ARGV[2]) then return -1 end
local moved = 0
for i = 3, #KEYS, 2 do
  while redis.call('LMOVE', KEYS[i + 1], KEYS[i], 'RIGHT', 'LEFT') do moved = moved + 1 end
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return moved
"""

# For each lease name, its holder: the live instance holding it, else (it is free) the proposed one if it is
# live, else the caller, which then holds it. Tells an instance other than the caller on its wake channel:
# always (ARGV[3] = 'all'), when the lease was just given to it ('changed'), or never ('none').
# KEYS: owners, instances. ARGV: caller, lease seconds, when to tell, channel prefix, then (name, proposed).
_CLAIM = """
local t = redis.call('TIME')
local alive_after = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[2])
local function alive(id)
  local beat = redis.call('ZSCORE', KEYS[2], id)
  return beat and tonumber(beat) >= alive_after
end
local holders = {}
for i = 5, #ARGV, 2 do
  local name = ARGV[i]
  local holder = redis.call('HGET', KEYS[1], name)
  local changed = false
  if not holder or (holder ~= ARGV[1] and not alive(holder)) then
    holder = ARGV[i + 1]
    if holder ~= ARGV[1] and not alive(holder) then holder = ARGV[1] end
    redis.call('HSET', KEYS[1], name, holder)
    changed = true
  end
  if holder ~= ARGV[1] and (ARGV[3] == 'all' or (changed and ARGV[3] == 'changed')) then
    redis.call('PUBLISH', ARGV[4] .. holder, name)
  end
  holders[#holders + 1] = holder
end
return holders
"""

# Records uplinks that opened to instance ARGV[1] (the first ARGV[3] twins after it) and forgets those that
# closed there (the rest: each only if it is still said to be that instance's); writes the change under the
# new version in the list of the last ARGV[2] changes; returns the twins among the opened whose send queue is
# not empty. KEYS: uplinks, their version, destinations, the changes.
_UPLINKS_CHANGED = """
local opened = tonumber(ARGV[3])
local waiting = {}
for i = 4, 3 + opened do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
  if redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 1 then waiting[#waiting + 1] = ARGV[i] end
end
for i = 4 + opened, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
local version = redis.call('INCR', KEYS[2])
local change = table.concat({version, ARGV[1], table.concat(ARGV, ',', 4, 3 + opened),
  table.concat(ARGV, ',', 4 + opened, #ARGV)}, '|')
if redis.call('RPUSH', KEYS[4], change) > tonumber(ARGV[2]) then
  redis.call('LTRIM', KEYS[4], -tonumber(ARGV[2]), -1)
end
return waiting
"""

# The changes of the uplinks after version ARGV[1], oldest first; false when the list of the last changes
# does not reach back to it (the hash is read whole instead). KEYS: the changes.
_UPLINK_CHANGES_SINCE = """
local first = redis.call('LINDEX', KEYS[1], 0)
if not first then return false end
local start = tonumber(ARGV[1]) + 1 - tonumber(string.match(first, '^%d+'))
if start < 0 then return false end
return redis.call('LRANGE', KEYS[1], start, -1)
"""

# Changes of the uplinks kept for instances to read (one per batch recorded, of up to UPLINK_BATCH twins):
# an instance that missed more reads the hash whole.
UPLINK_CHANGES_KEPT = 1000

# Hands leases the caller holds to other instances (or frees them: an empty name of the next holder), and
# tells each new holder. KEYS: owners. ARGV: caller, channel prefix, then (name, next holder) pairs.
_HAND_OVER = """
local given = 0
for i = 3, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then
    if ARGV[i + 1] == '' then
      redis.call('HDEL', KEYS[1], ARGV[i])
    else
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
      redis.call('PUBLISH', ARGV[2] .. ARGV[i + 1], ARGV[i])
    end
    given = given + 1
  end
end
return given
"""

Tell = Literal["all", "changed", "none"]


def announcement(name: str, carried: bytes | None) -> bytes:
    """What goes on a holder's wake channel: the lease's name, then the work it carries, if any."""
    return name.encode() if carried is None else name.encode() + b"\n" + carried


def read_announcement(data: bytes | str) -> tuple[str, bytes | None]:
    """The lease's name and the carried work (None: none) of an announcement."""
    raw = data if isinstance(data, bytes) else data.encode()
    name, newline, carried = raw.partition(b"\n")
    return name.decode(errors="replace"), carried if newline else None


# The channel of instance X is this prefix followed by X.
_CHANNEL_PREFIX = keys.wake_channel("")


@dataclass(frozen=True)
class UplinkChange:
    """One change of the uplinks: those that opened to ``instance`` and those that closed there."""

    version: int
    instance: str
    opened: list[str]
    closed: list[str]

    def apply(self, holders: dict[str, str]) -> None:
        """Make ``holders`` (twin -> instance) what the change made the hash."""
        for twin in self.opened:
            holders[twin] = self.instance
        for twin in self.closed:
            if holders.get(twin) == self.instance:
                del holders[twin]

    @classmethod
    def parse(cls, raw: bytes | str) -> UplinkChange:
        version, rest = as_text(raw).split("|", 1)
        instance, opened, closed = rest.rsplit("|", 2)
        return cls(int(version), instance, _twins(opened), _twins(closed))


def _twins(listed: str) -> list[str]:
    return listed.split(",") if listed else []


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found: whether this instance was still in the set, Redis's time, every instance's
    last beat."""

    was_present: bool
    now: float
    beats: dict[str, float]
    # The version of the uplinks' hash (it changes with every uplink that opens or closes).
    uplinks_version: int = 0


class InstanceStore:
    """The instances of the site and their leases, in Redis. Takes an open ``redis.asyncio.Redis``."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._heartbeat = redis.register_script(_HEARTBEAT)
        self._bury = redis.register_script(_BURY)
        self._claim = redis.register_script(_CLAIM)
        self._hand_over = redis.register_script(_HAND_OVER)
        self._uplinks_changed = redis.register_script(_UPLINKS_CHANGED)
        self._uplink_changes_since = redis.register_script(_UPLINK_CHANGES_SINCE)

    async def heartbeat(self, instance: str, info: Mapping[str, str], ttl_s: int) -> Beat:
        fields = [value for pair in info.items() for value in pair]
        present, now, flat, version = await self._heartbeat(
            keys=[keys.INSTANCES, keys.instance_info(instance), keys.UPLINKS_VERSION],
            args=[instance, ttl_s, *fields],
        )
        beats = {as_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}
        return Beat(bool(present), float(now), beats, int(version))

    async def uplink_holders(self) -> tuple[dict[str, str], int]:
        """Which instance each twin's uplink is open to (twin id -> instance), and the version that is."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.UPLINKS)
            pipe.get(keys.UPLINKS_VERSION)
            found, version = await pipe.execute()
        return {as_text(k): as_text(v) for k, v in found.items()}, int(version or 0)

    async def uplink_changes_since(self, version: int) -> list[UplinkChange] | None:
        """The changes of the uplinks after ``version``, oldest first; None when they are not all kept any
        more (or the version is not one Redis had: it lost them), and the hash must be read whole."""
        found = await self._uplink_changes_since(keys=[keys.UPLINK_CHANGES], args=[version])
        if found is None:
            return None
        changes = [UplinkChange.parse(raw) for raw in found]
        if not changes or changes[0].version != version + 1:
            return None
        return changes

    async def uplinks_changed(self, instance: str, opened: Sequence[int], closed: Sequence[int]) -> list[int]:
        """Record the uplinks of ``opened`` as open to ``instance`` and forget those of ``closed`` (unless one
        opened again to another instance meanwhile), in one round trip; returns the twins of ``opened``
        that have something waiting to be sent to them."""
        args: list[str | int] = [instance, UPLINK_CHANGES_KEPT, len(opened), *map(str, opened)]
        args += map(str, closed)
        waiting = await self._uplinks_changed(
            keys=[keys.UPLINKS, keys.UPLINKS_VERSION, keys.DESTINATIONS, keys.UPLINK_CHANGES], args=args
        )
        return [int(as_text(twin)) for twin in waiting]

    async def describe(self, instance: str) -> dict[str, str]:
        """What ``instance`` last said of itself (empty once its heartbeats stopped long enough)."""
        found = await self.redis.hgetall(keys.instance_info(instance))
        return {as_text(k): as_text(v) for k, v in found.items()}

    async def now(self) -> float:
        """Redis's clock (unix seconds), by which beats are timed."""
        seconds, micros = await self.redis.time()
        return float(seconds) + float(micros) / 1_000_000

    async def beat_of(self, instance: str) -> float | None:
        beat = await self.redis.zscore(keys.INSTANCES, instance)
        return None if beat is None else float(beat)

    async def bury(self, instance: str, beat_at_most: float, queues: Sequence[str]) -> int | None:
        """Take over dead ``instance`` (unless it beat after ``beat_at_most``): its unfinished items go back
        to the head of their ``queues``. Returns how many, or None when it turned out to be alive."""
        script_keys = [keys.INSTANCES, keys.instance_info(instance)]
        for queue in queues:
            script_keys += [queue, keys.instance_processing(queue, instance)]
        moved = int(await self._bury(keys=script_keys, args=[instance, beat_at_most]))
        return None if moved < 0 else moved

    async def claim(
        self, instance: str, proposed: Mapping[str, str], lease_s: float, tell: Tell
    ) -> dict[str, str]:
        """Each lease's holder after giving the free ones as ``proposed`` (name -> instance)."""
        if not proposed:
            return {}
        pairs = [value for pair in proposed.items() for value in pair]
        holders = await self._claim(
            keys=[keys.OWNERS, keys.INSTANCES], args=[instance, lease_s, tell, _CHANNEL_PREFIX, *pairs]
        )
        return {name: as_text(holder) for name, holder in zip(proposed, holders, strict=True)}

    async def announce(self, notices: Mapping[str, Notice]) -> set[str]:
        """Tell each lease's holder of new work under it (with the work when it is carried), in one round
        trip; returns the names whose holder did not hear it (it no longer listens)."""
        messages = [
            (keys.wake_channel(notice.holder), announcement(name, notice.carried))
            for name, notice in notices.items()
        ]
        if len(messages) == 1:
            heard = [await self.redis.publish(*messages[0])]
        else:
            async with self.redis.pipeline(transaction=False) as pipe:
                for channel, message in messages:
                    pipe.publish(channel, message)
                heard = await pipe.execute()
        return {name for name, listeners in zip(notices, heard, strict=True) if not listeners}

    async def hand_over(self, instance: str, successors: Mapping[str, str]) -> int:
        """Give the leases ``instance`` holds among ``successors`` (name -> next holder, "" to free it) and
        tell the next holders; returns how many it held."""
        if not successors:
            return 0
        pairs = [value for pair in successors.items() for value in pair]
        return int(await self._hand_over(keys=[keys.OWNERS], args=[instance, _CHANNEL_PREFIX, *pairs]))

    async def leave(self, instance: str) -> None:
        """``instance`` stops: it is no longer one of the site's."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(keys.INSTANCES, instance)
            pipe.delete(keys.instance_info(instance))
            await pipe.execute()
