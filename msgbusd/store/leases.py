"""The leases this process holds, as Redis last confirmed them (:mod:`msgbusd.store.instances`): what the
senders, the taker of ``msgbus.system.local`` and the timers ask before each step of their work.

A lease leaves in two steps: it stops being held here at once (its user stops after the step it is in),
and is handed to its next holder in Redis only once nothing here uses it any more, so that no two
instances ever work under one lease. A lease with nothing left to do (a destination's sender that stopped,
idle) is freed the same way, to no one: what a process holds stays as small as what it is doing, however
many twins it has talked to. Work that comes up for it meanwhile claims it again once it is free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from wire.backoff import sleep_unless

# The most work carried to a holder in one announcement; beyond it the holder reads the work from Redis.
CARRIED_BYTES = 256 * 1024


@dataclass(frozen=True)
class Notice:
    """New work under a lease held by another instance: who to tell, and the work itself when it is small
    enough to carry (None: the holder reads it from Redis)."""

    holder: str
    carried: bytes | None = None


def _ignore_gained(name: str, resumed: bool) -> None:
    pass


def _ignore_told(name: str, carried: bytes | None) -> None:
    pass


def _ignore(name: str) -> None:
    pass


class Leases:
    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._held: set[str] = set()
        self._leaving: set[str] = set()
        # Leases being freed (handed to no one), and those of them that work wanted meanwhile.
        self._freeing: set[str] = set()
        self._wanted_again: set[str] = set()
        self._users: Counter[str] = Counter()
        # Names to claim: wanted by local work (their holder is told of it), or said to be ours by another.
        self._wanted: set[str] = set()
        self._told: set[str] = set()
        # The work each wanted name carries to its holder, in the order it came (None: not all of it).
        self._carried: dict[str, list[bytes] | None] = {}
        # Who held a lease that is not ours at the last claim: told of new work directly, without a claim.
        self._elsewhere: dict[str, str] = {}
        # Set when there is claiming or handing over to do.
        self.work = asyncio.Event()
        self._held_events: dict[str, asyncio.Event] = {}
        self._lost_events: dict[str, set[asyncio.Event]] = {}
        self._stopped = False
        # What the site does when it gains a lease (``resumed``: taken over, not asked for), is told of work
        # under one it holds (with the work, when it was carried), or is to let one go (wake the user, so
        # that it stops).
        self.on_gained: Callable[[str, bool], None] = _ignore_gained
        self.on_told: Callable[[str, bytes | None], None] = _ignore_told
        self.on_leaving: Callable[[str], None] = _ignore
        # Another instance was found to hold a lease wanted here (it is told of the work).
        self.on_elsewhere: Callable[[str], None] = _ignore
        # A lease held here has work waiting (all of it queued by this instance, which knows of it).
        self.on_still_held: Callable[[str], None] = _ignore

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, name: str) -> bool:
        return name in self._held

    def held(self) -> set[str]:
        return set(self._held)

    # --- asked for by the work -----------------------------------------------------------------------------

    def want(self, name: str, carried: bytes | None = None) -> bool:
        """There is work under ``name``, which is not held here: claim it or tell its holder. ``carried``:
        the work, for its holder to take from the announcement rather than from Redis (only a known holder
        is sent it). False if the work is left to whoever gets the lease next (it is being handed on, or
        this instance stops)."""
        if self._stopped:
            return False
        if name in self._leaving:
            if name not in self._freeing:
                return False
            self._wanted_again.add(name)
            return True
        chunks = self._carried.get(name) if name in self._wanted else []
        self._wanted.add(name)
        if (
            chunks is not None
            and carried is not None
            and sum(map(len, chunks)) + len(carried) <= CARRIED_BYTES
        ):
            chunks.append(carried)
            self._carried[name] = chunks
        else:
            self._carried[name] = None
        self.work.set()
        return True

    def holder_known(self, name: str) -> bool:
        """Another instance was last seen holding ``name`` (work wanted under it is carried to it)."""
        return name in self._elsewhere

    def told(self, name: str, carried: bytes | None = None) -> None:
        """Another instance says ``name`` is ours now (claimed to make sure), or has work for us under it
        (``carried``: that work)."""
        if self._stopped:
            return
        if name in self._held:
            self.on_told(name, carried)
        else:
            self._told.add(name)
            self.work.set()

    def take_claims(self) -> tuple[set[str], set[str], dict[str, Notice]]:
        """Since the last call: the names wanted whose holder is not known, the names told, and what to tell
        the known holders of the other names wanted."""
        wanted, told, carried = self._wanted - self._held, self._told, self._carried
        self._wanted, self._told, self._carried = set(), set(), {}
        elsewhere = self._elsewhere
        known = {
            name: Notice(elsewhere[name], _joined(carried.get(name))) for name in wanted & elsewhere.keys()
        }
        for name in known:
            self.on_elsewhere(name)
        return wanted - known.keys(), told, known

    def held_elsewhere(self, name: str, holder: str) -> None:
        """Redis says ``holder`` holds ``name``."""
        self._elsewhere[name] = holder
        self.on_elsewhere(name)

    def forget_holders(self, names: set[str] | None = None) -> None:
        """Who holds ``names`` (None: any lease) may have changed."""
        if names is None:
            self._elsewhere.clear()
        for name in names or ():
            self._elsewhere.pop(name, None)

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[None]:
        """Work under ``name`` runs inside this; the lease is handed on only once none does."""
        self._users[name] += 1
        try:
            yield
        finally:
            self._users[name] -= 1
            if not self._users[name]:
                del self._users[name]
                if name in self._leaving:
                    self.work.set()

    async def run_while_held(
        self,
        name: str,
        work: Callable[[asyncio.Event], Awaitable[None]],
        stopping: asyncio.Event,
        meanwhile: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    ) -> None:
        """Run ``work`` whenever ``name`` is held, and ``meanwhile`` (if given) whenever it is not, until
        ``stopping``; each gets an event set when it is to make way for the other (or the daemon stops), and
        must then return."""
        held = self._held_events.setdefault(name, asyncio.Event())
        while not stopping.is_set():
            if not self.holds(name):
                held.clear()
                if meanwhile is None:
                    await first_set(held, stopping)
                else:
                    await _run_until(meanwhile, held, stopping)
                continue
            lost = asyncio.Event()
            self._lost_events.setdefault(name, set()).add(lost)
            try:
                with self.using(name):
                    await work(lost)
            finally:
                self._lost_events[name].discard(lost)
            if self.holds(name) and not stopping.is_set():
                await sleep_unless(stopping, 0.1)

    # --- told by the coordinator -----------------------------------------------------------------------

    def gained(self, name: str, *, resumed: bool = False) -> None:
        """Redis says ``name`` is held here."""
        if self._stopped:
            return
        if name in self._leaving:
            if name in self._freeing:
                self._wanted_again.add(name)
            return
        self._elsewhere.pop(name, None)
        self._held.add(name)
        if name in self._held_events:
            self._held_events[name].set()
        self.on_gained(name, resumed)

    def still_held(self, name: str) -> None:
        """Redis says ``name`` is still held here, and there is work under it."""
        if name in self._held and not self._stopped:
            self.on_still_held(name)

    def let_go(self, name: str) -> None:
        """Stop working under ``name``; it is handed on once its users are done (:meth:`releasable`)."""
        if name not in self._held:
            return
        self._held.discard(name)
        self._leaving.add(name)
        for lost in self._lost_events.get(name, ()):
            lost.set()
        self.on_leaving(name)
        self.work.set()

    def free(self, name: str) -> None:
        """Nothing is left to do under ``name`` for now: let it go to no one (:meth:`frees`)."""
        if name in self._held:
            self._freeing.add(name)
            self.let_go(name)

    def frees(self, name: str) -> bool:
        """``name`` is let go to no one rather than handed on."""
        return name in self._freeing

    def drop_all(self) -> set[str]:
        """Redis no longer says this instance holds anything (it was taken for dead): stop all work, hand
        nothing on. Returns what was held."""
        dropped = self._held | self._leaving
        for name in list(self._held):
            self.let_go(name)
        self._leaving.clear()
        self._freeing.clear()
        self._wanted_again.clear()
        return dropped

    def releasable(self) -> set[str]:
        """Leases let go of that nothing here uses any more."""
        return {name for name in self._leaving if not self._users[name]}

    def released(self, names: set[str]) -> None:
        self._leaving -= names
        self._freeing -= names
        again = self._wanted_again & names
        self._wanted_again -= names
        if again and not self._stopped:
            # Wanted while it was being freed: claimed now that it is free (the work is in Redis).
            self._wanted |= again
            self._carried.update(dict.fromkeys(again))
            self.work.set()

    def stop(self) -> None:
        """The daemon stops: let go of everything; nothing is gained any more."""
        for name in list(self._held):
            self.let_go(name)
        self._stopped = True


def _joined(chunks: list[bytes] | None) -> bytes | None:
    """The carried work of one announcement: its chunks one after the other (each is whole items)."""
    return b"\n".join(chunks) if chunks else None


async def _run_until(work: Callable[[asyncio.Event], Awaitable[None]], *events: asyncio.Event) -> None:
    """Run ``work`` with an event set once one of ``events`` is."""
    until = asyncio.Event()
    watcher = asyncio.ensure_future(first_set(*events))
    watcher.add_done_callback(lambda _: until.set())
    try:
        await work(until)
    finally:
        watcher.cancel()


async def first_set(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    tasks = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
