"""How the daemon sets Python's cyclic garbage collector.

Python looks at its youngest generation every 700 more container objects made than freed, at the middle one
every tenth time, and at the oldest (where the ~90,000 objects start-up made live) every tenth of those once
it has grown by a quarter. With thousands of messages in flight, each holding a few dozen objects for a few
milliseconds, that was 1,500 looks for 10,000 new twins and 3.5 s of the daemon's 16 s of CPU. What the
daemon makes is freed when its last reference goes (it makes no cycles per message), so the collector is
asked less often and start-up's objects are set aside for good.

The oldest generation is where what lives long ends up: a site's links, thousands of them on a cloud site
with many edges, each a few dozen objects. Looking through it takes the daemon's whole core for a while
(0.2 s at 2,000 edges, about a second at 10,000), during which nothing else runs, so the daemon never asks
for it: Python does, when that generation has grown by a quarter since it last looked. What the daemon asks
for every little while (:mod:`msgbusd.site.memory`) is the two younger generations, whose cost follows the
work of the last moments, not how many links the site holds.
"""

from __future__ import annotations

import gc

# New containers (net) between two looks at the youngest generation: a few MB of objects at most.
YOUNG_THRESHOLD = 20_000
# The generations the daemon collects itself: the youngest and the middle one.
YOUNGER_GENERATIONS = 1


def settle_after_start_up() -> None:
    """Collect what start-up left, set every object alive now aside for good (:func:`gc.freeze`: the
    collector never walks them again) and look at the youngest generation every :data:`YOUNG_THRESHOLD`."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)


def collect_cycles() -> None:
    """Collect the cycles among the objects made since the last looks now (the two younger generations),
    so that those a burst left do not wait for the next burst; the oldest generation is left to Python's
    own schedule."""
    gc.collect(YOUNGER_GENERATIONS)
