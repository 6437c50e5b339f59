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
