"""The cyclic garbage collector as the daemon sets it: what start-up made is set aside for good, the
youngest generation is looked at less often, and cycles made later are still collected."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from msgbusd.site import garbage

loaded = len(gc.get_objects())
garbage.settle_after_start_up()
frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a
del a, b
gc.disable()  # only the explicit collection below may find the cycle
garbage.collect_cycles()
print(json.dumps({
    "loaded": loaded,
    "frozen": frozen,
    "tracked_after": tracked,
    "threshold": gc.get_threshold()[0],
    "cycle_collected": not any(type(o).__name__ == "Node" for o in gc.get_objects()),
}))
"""


def test_start_up_objects_are_set_aside_and_later_cycles_still_collected() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    figures = json.loads(child.stdout)
    assert figures["frozen"] >= figures["loaded"] // 2, figures
    assert figures["tracked_after"] < figures["frozen"] // 10, figures
    assert figures["threshold"] > 700, figures
    assert figures["cycle_collected"] is True, figures


PERIODIC_CHILD = """
import asyncio, gc, weakref
from msgbusd.site.garbage import collect_cycles_until

class Node:
    pass

async def main():
    gc.disable()  # only the daemon's periodic collection may find the cycle
    a, b = Node(), Node()
    a.other, b.other = b, a
    left = weakref.ref(a)
    del a, b
    stopping = asyncio.Event()
    task = asyncio.create_task(collect_cycles_until(stopping, every_s=0.01))
    async with asyncio.timeout(10):
        while left() is not None:
            await asyncio.sleep(0.01)
    stopping.set()
    await task
    print("collected")

asyncio.run(main())
"""


def test_the_collection_timer_collects_cycles_left_by_a_burst() -> None:
    child = subprocess.run(
        [sys.executable, "-c", PERIODIC_CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    assert child.stdout.strip() == "collected"


OLDEST_CHILD = """
import gc, json, weakref
from msgbusd.site import garbage

garbage.settle_after_start_up()
gc.disable()

class Node:
    pass

alive = Node()
a, b = Node(), Node()
a.other, b.other = b, a
left = weakref.ref(a)
del a, b
full_before = gc.get_stats()[2]["collections"]
tracked_before = len(gc.get_objects())
garbage.collect_cycles()
print(json.dumps({
    "cycle_collected": left() is None,
    "full": gc.get_stats()[2]["collections"] - full_before,
    "alive_set_aside": not any(o is alive for o in gc.get_objects()),
    "tracked_after": len(gc.get_objects()),
    "tracked_before": tracked_before,
}))
"""


def test_the_periodic_collection_frees_young_cycles_and_sets_aside_what_lives_on() -> None:
    child = subprocess.run(
        [sys.executable, "-c", OLDEST_CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    figures = json.loads(child.stdout)
    assert figures["cycle_collected"] is True, figures
    assert figures["full"] == 0, "the oldest generation is not walked"
    assert figures["alive_set_aside"] is True, figures
    assert figures["tracked_after"] < figures["tracked_before"] / 2, figures


HERD_CHILD = """
import asyncio, gc, json
from msgbusd.site import garbage

garbage.settle_after_start_up()
gc.disable()  # only the setting aside may move what was made

class Link:
    pass

async def main():
    long_lived = garbage.LongLived(after=3)
    links = []
    counts = []
    for _ in range(7):
        links.append(Link())
        long_lived.made()
        await asyncio.sleep(0)  # the step after the one that made it
        counts.append(sum(1 for o in gc.get_objects() if type(o) is Link))
    print(json.dumps(counts))

asyncio.run(main())
"""


def test_links_made_in_a_herd_are_set_aside_after_every_few() -> None:
    child = subprocess.run(
        [sys.executable, "-c", HERD_CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    # Still walked by the collector: 1, 2, then none after the third; 1, 2, none after the sixth; 1.
    assert json.loads(child.stdout) == [1, 2, 0, 1, 2, 0, 1]
