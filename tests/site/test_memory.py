"""Memory a burst freed goes back to the system: the C library's heap, full of holes once most of what a
burst allocated is freed, is handed back page by page (glibc's ``malloc_trim``)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json
from msgbusd.site.memory import release_free_memory

def rss_mib():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024

before = rss_mib()
# Envelope-sized objects (over 512 bytes: the C library's malloc, not Python's own allocator), one in a
# hundred kept: the heap keeps its pages, each holding something alive at its top or in its holes.
burst = [bytes(1000) + bytes([n % 256]) for n in range(100_000)]
kept = burst[::100]
del burst
after_burst = rss_mib()
released = release_free_memory()
print(json.dumps({"before": before, "after_burst": after_burst, "released": released, "after": rss_mib()}))
"""


def test_memory_a_burst_freed_is_given_back() -> None:
    command = [sys.executable, "-c", CHILD]
    child = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    figures = json.loads(child.stdout)
    assert figures["released"] is True
    grown = figures["after_burst"] - figures["before"]
    assert grown > 50, figures
    assert figures["after"] - figures["before"] < grown / 4, figures
