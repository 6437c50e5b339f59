"""One daemon process among the site's instances: its heartbeat, the leases it claims and hands on, and
taking over an instance that died.

- Every ``lease_s / 5`` seconds the instance beats (Redis's clock). An instance whose last beat is older
  than ``lease_s`` is dead; so is one on this machine whose process is gone (known at once). A live instance
  buries it: moves its processing lists back to the head of their queues and gives its leases to the live
  instances.
- Each lease (a destination's sending, taking from ``msgbus.system.local`` or ``msgbus.system.reply``, the
  timers) goes to the live instance that rendezvous hashing picks for it, so the work spreads and moves as
  little as possible when an instance comes or goes. A lease whose instance is not the pick is handed on
  once nothing uses it.
- A twin that keeps an uplink to this site (``msgbusd --uplink`` at its site) is reached over that link only:
  the lease of sending to it goes to the instance the link is open to, while that instance is live.
- Work that comes up for a lease held elsewhere is announced to its holder on the holder's wake channel,
  carrying the work itself when it is small (the holder then sends it from memory instead of reading it
  back). Each instance also looks over the waiting destinations every few seconds, so a lost announcement
  (Redis restarted) only delays.
- An instance that cannot beat for most of its lease stops all work under its leases: the others may take
  them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from redis.exceptions import RedisError

from msgbusd.errors import StartupError
from msgbusd.site.process_info import ProcessInfo
from msgbusd.store.instances import Beat, InstanceStore, Tell, read_announcement
from msgbusd.store.leases import Leases, first_set
from wire import keys
from wire.backoff import REDIS_RECONNECT, sleep_unless

log = logging.getLogger("msgbusd.instances")

# Every waiting destination is looked over this often (lost announcements; leases of the dead).
SWEEP_S = 5.0
BEATS_PER_LEASE = 5
# Uplinks that opened or closed are recorded in Redis this long after the first of them, this many at a time
# at most: a herd of edges coming back is a few round trips, not one each.
UPLINK_RECORD_AFTER_S = 0.05
UPLINK_BATCH = 1000
# The others' uplinks are read as what changed since the last read, or whole when Redis no longer has all of
# that (90-130 ms at 100,000 edges): after a read, the next waits this many times as long as it took, so that
# a herd changing them at every beat costs a bounded share of a core (a twentieth) and stalls the loop that
# seldom. Meanwhile a lease may go to the instance the uplink is not open to, whose sender waits for it; the
# lease follows the uplink at the next read.
UPLINKS_READ_SPACING = 20


def pick(name: str, live: Iterable[str]) -> str:
    """The instance that should hold lease ``name`` among ``live`` (rendezvous hashing)."""
    return max(
        live, key=lambda instance: hashlib.blake2b(f"{instance}\0{name}".encode(), digest_size=8).digest()
    )


class Instance:
    def __init__(
        self,
        store: InstanceStore,
        leases: Leases,
        *,
        lease_s: float,
        queues: Sequence[str],
        pending: Callable[[], Awaitable[list[int]]],
        describe: Callable[[], Mapping[str, str]] = dict,
        process: ProcessInfo | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = leases.instance
        self.lease_s = lease_s
        self.beat_s = lease_s / BEATS_PER_LEASE
        self._store = store
        self._leases = leases
        self._queues = queues
        # The destinations whose send queue is not empty.
        self._pending = pending
        self._describe = describe
        self._process = process or ProcessInfo.this()
        self._clock = clock
        # The live instances at the last beat (with this one).
        self.live: list[str] = [self.id]
        self._last_beat_ok = -1e9
        # Since when beats have gone through one after the other: only then are other instances judged by
        # their age (after an outage of Redis every instance's last beat is old).
        self._beating_since: float | None = None
        self._next_sweep = 0.0
        # Work under a lease held here may have been queued without this instance hearing of it (another
        # instance was live, or announcements were lost) since the last sweep: the sweep has the senders of
        # such leases read their queues again. With this instance alone, all it queued it knows.
        self._unheard_since_sweep = True
        self._processes: dict[str, ProcessInfo | None] = {}
        # Leases that go to a given instance while it is live (a twin's sending, to the instance its uplink
        # is open to): this instance's own as they change, the others' read at a beat when they changed.
        self.preferred: dict[str, str] = {}
        self._uplinks_version: int | None = None
        # When the others' uplinks may be read again (this instance's clock).
        self._uplinks_read_after = -1e9
        # Uplinks opened (True) or closed (False) here and not recorded in Redis yet, the latest last.
        self._uplink_changes: dict[int, bool] = {}
        self._record_uplinks_at: asyncio.TimerHandle | None = None

    # --- joining and leaving -----------------------------------------------------------------------------

    async def join(self) -> None:
        """Become one of the site's instances; refused while a live process runs under the same name."""
        beat = await self._store.beat_of(self.id)
        if beat is not None:
            other = ProcessInfo.from_json((await self._store.describe(self.id)).get("process", ""))
            redis_now = await self._store.now()
            running = other is not None and other != self._process and redis_now - beat < self.lease_s
            if running and other is not None and not other.gone():
                raise StartupError(
                    f"instance {self.id!r} is already running (pid {other.pid} on {other.host}, last "
                    f"heartbeat {redis_now - beat:.1f}s ago); give this process another --instance"
                )
        await self.beat_and_settle(force_sweep=True)

    async def leave(self) -> None:
        """Hand every lease to the live instances left, and stop being one of the site's."""
        self._leases.stop()
        others = [instance for instance in self.live if instance != self.id]
        names = self._leases.releasable()
        successors = {name: self._pick(name, others) if others else "" for name in names}
        try:
            await self._store.hand_over(self.id, successors)
            await self._store.leave(self.id)
            log.info("left the site: %d lease(s) handed to %d other instance(s)", len(names), len(others))
        except (RedisError, OSError) as exc:
            log.warning(
                "could not leave the site (redis: %s): the others take over once its lease is out", exc
            )
        self._leases.released(set(names))

    # --- the loops -----------------------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        """Beat, judge, claim and hand on until ``stopping``."""
        next_beat = self._clock() + self.beat_s
        failures = 0
        while not stopping.is_set():
            self._leases.work.clear()
            try:
                if self._clock() >= next_beat:
                    next_beat = self._clock() + self.beat_s
                    await self.beat_and_settle()
                await self.settle_claims()
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                self._beating_since = None
                if self._clock() - self._last_beat_ok > self.lease_s * 0.8 and len(self._leases):
                    dropped = self._leases.drop_all()
                    # Claimed again at the first beat that goes through (if no one took them meanwhile).
                    self._next_sweep = 0.0
                    log.error(
                        "no heartbeat for %.1fs (redis: %s): stopped the work under %d lease(s); other "
                        "instances may take them over",
                        self._clock() - self._last_beat_ok,
                        exc,
                        len(dropped),
                    )
                await sleep_unless(stopping, min(REDIS_RECONNECT.delay_s(failures), self.beat_s))
                continue
            wait = max(0.0, next_beat - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await first_set(self._leases.work, stopping)

    async def listen(self, stopping: asyncio.Event) -> None:
        """Take the announcements on this instance's wake channel until ``stopping``."""
        failures = 0
        while not stopping.is_set():
            pubsub = self._store.redis.pubsub()
            try:
                await pubsub.subscribe(keys.wake_channel(self.id))
                if failures:
                    # Announcements may have been lost meanwhile: look over the waiting work now.
                    self._next_sweep = 0.0
                    self._unheard_since_sweep = True
                    self._leases.work.set()
                failures = 0
                while not stopping.is_set():
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.beat_s)
                    if message is not None:
                        self._leases.told(*read_announcement(message["data"]))
            except (RedisError, OSError) as exc:
                failures += 1
                log.warning("wake channel: redis failed (%s); subscribing again", exc)
                await sleep_unless(stopping, REDIS_RECONNECT.delay_s(failures))
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    # --- one round -----------------------------------------------------------------------------------------

    async def _beat(self) -> Beat:
        info = {"process": self._process.to_json(), "owned": str(len(self._leases)), **self._describe()}
        beat = await self._store.heartbeat(self.id, info, ttl_s=max(1, int(self.lease_s * 4)))
        now = self._clock()
        self._last_beat_ok = now
        if self._beating_since is None:
            self._beating_since = now
        return beat

    async def beat_and_settle(self, *, force_sweep: bool = False) -> None:
        beat = await self._beat()
        swept = force_sweep
        if not beat.was_present and len(self._leases):
            dropped = self._leases.drop_all()
            log.warning(
                "this instance was taken for dead (no heartbeat within %.1fs); %d lease(s) went to others",
                self.lease_s,
                len(dropped),
            )
            swept = True
        live = {instance for instance, at in beat.beats.items() if beat.now - at <= self.lease_s}
        buried = await self._bury_dead(beat)
        live = (live - buried) | {self.id}
        if buried or live != set(self.live):
            swept = True
        if len(live) > 1 or len(self.live) > 1:
            self._unheard_since_sweep = True
        self.live = sorted(live)
        if (
            len(self.live) > 1
            and beat.uplinks_version != self._uplinks_version
            and self._clock() >= self._uplinks_read_after
        ):
            started = time.perf_counter()
            await self._read_uplinks(beat.uplinks_version)
            took_s = time.perf_counter() - started
            self._uplinks_read_after = self._clock() + UPLINKS_READ_SPACING * took_s
        if swept or self._clock() >= self._next_sweep:
            # What a previous run or a dead instance left waits for peers nobody here knows the state of:
            # their senders probe them first.
            await self._sweep(taken_over=force_sweep or bool(buried))
        self._rebalance()

    async def _read_uplinks(self, version: int) -> None:
        """Which instance each twin's uplink is open to, as Redis says (with the changes here not recorded
        yet): read when other instances are live and it changed since the last read; what changed since,
        when Redis still has all of it, else the whole map."""
        changes = None
        if self._uplinks_version is not None and self._uplinks_version < version:
            changes = await self._store.uplink_changes_since(self._uplinks_version)
        if changes is None:
            self.preferred, self._uplinks_version = await self._store.uplink_holders()
        else:
            # In Redis's order (this instance's own changes among them), on top of what was read before.
            for change in changes:
                change.apply(self.preferred)
            self._uplinks_version = changes[-1].version
        for twin, opened in self._uplink_changes.items():
            if opened:
                self.preferred[str(twin)] = self.id
            elif self.preferred.get(str(twin)) == self.id:
                del self.preferred[str(twin)]

    async def _bury_dead(self, beat: Beat) -> set[str]:
        judge_by_age = self._beating_since is not None and self._clock() - self._beating_since >= self.lease_s
        buried: set[str] = set()
        for other, at in beat.beats.items():
            if other == self.id:
                continue
            age = beat.now - at
            dead = judge_by_age and age > self.lease_s
            if not dead and age > 2 * self.beat_s:
                dead = await self._process_gone(other)
            if not dead:
                continue
            moved = await self._store.bury(other, at, self._queues)
            if moved is None:
                continue
            buried.add(other)
            self._processes.pop(other, None)
            log.warning(
                "instance %s is dead (no heartbeat for %.1fs); took back its leases and %d item(s)",
                other,
                age,
                moved,
            )
        return buried

    async def _process_gone(self, other: str) -> bool:
        if other not in self._processes:
            described = await self._store.describe(other)
            self._processes[other] = ProcessInfo.from_json(described.get("process", ""))
        process = self._processes[other]
        return process is not None and process.gone()

    async def _sweep(self, *, taken_over: bool) -> None:
        """Claim what waits (each free lease to its pick) and kick the work under the leases held here;
        ``taken_over``: what is gained was left by a previous run or a dead instance."""
        self._next_sweep = self._clock() + SWEEP_S
        self._leases.forget_holders()
        look_again, self._unheard_since_sweep = self._unheard_since_sweep or taken_over, False
        names = [keys.LOCAL_LEASE, keys.REPLY_LEASE, keys.TIMERS_LEASE, *map(str, await self._pending())]
        await self._claim(
            {name: self._pick(name, self.live) for name in names},
            "changed",
            resumed=taken_over,
            look_again=look_again,
        )

    def _rebalance(self) -> None:
        for name in self._leases.held():
            if self._pick(name, self.live) != self.id:
                self._leases.let_go(name)

    async def settle_claims(self) -> None:
        """Record the uplinks that changed, claim what local work wants and what others said is ours; hand on
        what is no longer used."""
        await self._record_uplinks()
        wanted, told, known = self._leases.take_claims()
        if known:
            # Their holders are told directly; one that is gone (no one listens) is claimed instead.
            unheard = await self._store.announce(known)
            self._leases.forget_holders(unheard)
            wanted |= unheard
        if wanted:
            await self._claim({name: self._pick(name, self.live) for name in wanted}, "all", resumed=False)
        if told:
            # Told by an instance that took us for the holder: if another holds it now, it is told in turn.
            await self._claim({name: self.id for name in told}, "all", resumed=False)
        releasable = self._leases.releasable()
        if releasable:
            others = [instance for instance in self.live if instance != self.id]
            successors = {
                name: self._pick(name, others) if others and not self._leases.frees(name) else ""
                for name in releasable
            }
            await self._store.hand_over(self.id, successors)
            self._leases.released(releasable)

    def _pick(self, name: str, live: Sequence[str]) -> str:
        """The instance that should hold lease ``name`` among ``live``: the preferred one, else the pick."""
        preferred = self.preferred.get(name)
        return preferred if preferred is not None and preferred in live else pick(name, live)

    async def uplink_changed(self, twin: int, opened: bool) -> None:
        """``twin``'s uplink opened to this instance, or closed: the lease of sending to it follows. Recorded
        in Redis with the others that changed meanwhile, by the instance's loop (:meth:`settle_claims`)."""
        name = str(twin)
        if opened:
            self.preferred[name] = self.id
        elif self.preferred.get(name) == self.id:
            del self.preferred[name]
        self._uplink_changes.pop(twin, None)
        self._uplink_changes[twin] = opened
        if self._record_uplinks_at is None:
            self._record_uplinks_at = asyncio.get_running_loop().call_later(
                UPLINK_RECORD_AFTER_S, self._uplinks_due
            )

    def _uplinks_due(self) -> None:
        self._record_uplinks_at = None
        self._leases.work.set()

    async def _record_uplinks(self) -> None:
        """Record the uplinks that changed here, a batch a round trip; the lease of sending to a twin whose
        uplink opened here is claimed when something waits for it (an idle edge needs no sender)."""
        while self._uplink_changes:
            batch = list(itertools.islice(self._uplink_changes.items(), UPLINK_BATCH))
            opened = [twin for twin, is_open in batch if is_open]
            closed = [twin for twin, is_open in batch if not is_open]
            waiting = await self._store.uplinks_changed(self.id, opened, closed)
            for twin, is_open in batch:
                if self._uplink_changes.get(twin) == is_open:
                    del self._uplink_changes[twin]
            for twin in waiting:
                name = str(twin)
                if self.preferred.get(name) == self.id and not self._leases.holds(name):
                    self._leases.want(name)

    async def _claim(
        self, proposed: Mapping[str, str], tell: Tell, *, resumed: bool, look_again: bool = True
    ) -> None:
        """Claim the leases of ``proposed``; ``look_again``: those already held here may hold work this
        instance was not told of (their users look again)."""
        holders = await self._store.claim(self.id, proposed, self.lease_s, tell)
        for name, holder in holders.items():
            if holder == self.id:
                already = self._leases.holds(name)
                if not already or look_again:
                    self._leases.gained(name, resumed=resumed and not already)
                else:
                    self._leases.still_held(name)
            else:
                self._leases.held_elsewhere(name, holder)

    def fresh(self) -> bool:
        """The last heartbeat went through recently enough for this instance to count as live."""
        return self._clock() - self._last_beat_ok <= self.lease_s * 0.8
