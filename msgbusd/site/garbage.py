"""How the daemon sets Python's cyclic garbage collector.

Python looks at its youngest generation every 700 more container objects made than freed, at the middle one
every tenth time, and at the oldest (where the ~90,000 objects start-up made live) every tenth of those once
it has grown by a quarter. With thousands of messages in flight, each holding a few dozen objects for a few
milliseconds, that was 1,500 looks for 10,000 new twins and 3.5 s of the daemon's 16 s of CPU. What the
daemon makes is freed when its last reference goes (it makes no cycles per message, and a link's
connection lets go of what refers back to it when it closes), so the collector is asked less often
(:data:`YOUNG_THRESHOLD`).

What lives long is set aside for good (:func:`gc.freeze`: the collector never walks it again): start-up's
objects at once, and every :data:`COLLECT_EVERY_S` (:func:`collect_cycles_until`) what lived through a look
at the younger generations. A cloud site's links to its edges live for days, a few
dozen objects each: walking 10,000 of them took the daemon's whole core for half a second (nothing else
runs meanwhile), which Python did every few minutes under traffic. Set aside, the oldest generation holds
only what came to it since, and Python's own looks at it take milliseconds. A herd of edges makes thousands
of links within seconds: they are set aside as they come, after every :data:`SET_ASIDE_AFTER` of them
(:class:`LongLived`), so that a look at the oldest generation meanwhile walks at most that many, not all
(half a second for 10,000). What is set aside and later becomes a cycle with nothing else referring to it
is never collected: the daemon's own objects do not (``tests/link/test_site_socket.py`` checks a link's
connection's), and ``msgbus_gc_pause_seconds`` and the daemon's resident memory show it if a library's do.

Why that often: Python counts a look at its youngest generation due once :data:`YOUNG_THRESHOLD` more
containers were made than freed, old ones freed included, so while long-lived things are replaced (a cloud
site's ten thousand links renew what they hold at every ping) the young ones pile up between its looks,
and its middle generation's looks walked 35,000-75,000 objects: 20-50 ms in which nothing else ran, the
tail of a cloud's round trips. Looked at every half second, the younger generations hold what half a second
left alive: a look takes 1-5 ms.
"""

from __future__ import annotations

import asyncio
import gc

from wire.backoff import sleep_unless

# New containers (net) between two looks at the youngest generation. A look costs about a microsecond an
# object on a cloud site's large heap (each reference it follows is a cache miss): 20,000 made looks of 30-50
# ms at 10,000 edges under traffic, this 10-15 ms (and the middle generation's every tenth look 50 ms, not
# 120).
YOUNG_THRESHOLD = 5_000
# The generations the daemon collects itself: the youngest and the middle one.
YOUNGER_GENERATIONS = 1
# Long-lived things (links) made between two settings aside: a look at the oldest generation walks at most
# that many (about 50 objects each: tens of milliseconds). Each setting aside costs a look at the younger
# generations, which Python makes anyway every few hundred links of a herd.
SET_ASIDE_AFTER = 1_000
# The younger generations are collected, and what lives on set aside, this often.
COLLECT_EVERY_S = 0.5


def settle_after_start_up() -> None:
    """Collect what start-up left, set every object alive now aside for good (:func:`gc.freeze`: the
    collector never walks them again) and look at the youngest generation every :data:`YOUNG_THRESHOLD`."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


def collect_cycles() -> None:
    """Collect the cycles among the objects made since the last looks (the two younger generations), so that
    those a burst left do not wait for the next burst, and set aside for good what lives on."""
    gc.collect(YOUNGER_GENERATIONS)
    gc.freeze()


async def collect_cycles_until(stopping: asyncio.Event, every_s: float = COLLECT_EVERY_S) -> None:
    """:func:`collect_cycles` every ``every_s`` until ``stopping``."""
    while not stopping.is_set():
        await sleep_unless(stopping, every_s)
        collect_cycles()


class LongLived:
    """Counts things made to live long (a link); after every ``after`` of them, collects the younger
    generations and sets what lives on aside (:func:`collect_cycles`), soon after the current step of the
    event loop."""

    def __init__(self, after: int = SET_ASIDE_AFTER) -> None:
        self._after = after
        self._made = 0

    def made(self) -> None:
        self._made += 1
        if self._made >= self._after:
            self._made = 0
            asyncio.get_running_loop().call_soon(collect_cycles)
