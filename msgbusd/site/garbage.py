"""How the daemon sets Python's cyclic garbage collector.

Python looks at its youngest generation every 700 more container objects made than freed, at the middle one
every tenth time, and at the oldest (where the ~90,000 objects start-up made live) every tenth of those once
it has grown by a quarter. With thousands of messages in flight, each holding a few dozen objects for a few
milliseconds, that was 1,500 looks for 10,000 new twins and 3.5 s of the daemon's 16 s of CPU. What the
daemon makes is freed when its last reference goes (it makes no cycles per message), so the collector is
asked less often and start-up's objects are set aside for good; every generation is also collected when the
memory is given back (:mod:`msgbusd.site.memory`), so that a burst's cycles do not wait for the next.
"""

from __future__ import annotations

import gc

# New containers (net) between two looks at the youngest generation: a few MB of objects at most.
YOUNG_THRESHOLD = 20_000


def settle_after_start_up() -> None:
    """Collect what start-up left, set every object alive now aside for good (:func:`gc.freeze`: the
    collector never walks them again) and look at the youngest generation every :data:`YOUNG_THRESHOLD`."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


def collect_cycles() -> None:
    """Collect every generation now, so that the cycles a burst left do not wait for the next burst (a
    few tens of milliseconds after a burst to 10,000 twins, start-up's objects being set aside)."""
    gc.collect()
