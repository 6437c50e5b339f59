"""What goes wrong with a network test bed.

- ``NetBedError``: a command that builds or changes the bed failed (its argv and stderr in the text).
  - ``NetBedUnavailable``: this machine cannot make a bed at all (not root, a program missing, no TUN);
    tests skip with its reason instead of failing.
"""

from __future__ import annotations


class NetBedError(RuntimeError):
    """A command that builds or changes the bed failed."""


class NetBedUnavailable(NetBedError):
    """A bed cannot be made on this machine; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
