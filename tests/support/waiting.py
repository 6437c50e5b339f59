"""Waiting on the event loop for a condition that nothing signals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition()`` on the event loop until it holds; ``TimeoutError`` naming ``what``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)
