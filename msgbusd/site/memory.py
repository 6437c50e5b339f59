"""Memory given back to the system after a burst of work.

Objects over 512 bytes (envelopes, buffers) come from the C library's ``malloc``, which keeps what is freed
inside its heap unless it is at the top; a burst to thousands of new twins leaves that heap with free pages
between the few objects still alive. glibc's ``malloc_trim`` hands every free page back; the daemon calls
it every :data:`RELEASE_EVERY_S` (it takes a few milliseconds). Without glibc, nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from wire.backoff import sleep_unless

RELEASE_EVERY_S = 30.0


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_free_memory() -> bool:
    """Give the C library's free memory back to the system now; False where that cannot be done."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def release_free_memory_until(stopping: asyncio.Event, every_s: float = RELEASE_EVERY_S) -> None:
    """:func:`release_free_memory` every ``every_s`` until ``stopping``."""
    while not stopping.is_set():
        await sleep_unless(stopping, every_s)
        release_free_memory()
