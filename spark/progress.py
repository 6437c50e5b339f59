"""Stage lines on the terminal while the job runs: what was done, with counts, and how long it took."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO


@dataclass
class Stage:
    """Filled in by the body of ``Progress.stage``: the counts to print when it ends."""

    detail: str = ""


class Progress:
    """Prints ``[elapsed] stage: detail (seconds)`` when each stage ends."""

    def __init__(self, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._out = out if out is not None else sys.stderr
        self._clock = clock
        self._started = clock()

    def note(self, text: str) -> None:
        """A line that is not a timed stage (a warning, where the outputs are)."""
        self._print(self._clock(), text)

    def _print(self, now: float, text: str) -> None:
        print(f"[{now - self._started:7.1f}s] {text}", file=self._out, flush=True)

    @contextmanager
    def stage(self, name: str) -> Iterator[Stage]:
        """Time the body; print one line when it ends (also when it fails, marked so)."""
        stage = Stage()
        begun = self._clock()
        try:
            yield stage
        except BaseException:
            now = self._clock()
            self._print(now, f"{name}: failed after {now - begun:.1f}s")
            raise
        now = self._clock()
        detail = f": {stage.detail}" if stage.detail else ""
        self._print(now, f"{name}{detail} ({now - begun:.1f}s)")
