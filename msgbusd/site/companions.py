"""Work that runs beside the daemon in its process (the rules router), and the narrow handle it gets.

A companion is found through the ``msgbusd.companions`` entry points of the installed packages: each one is
a :class:`CompanionOptions` that adds its options to the ``msgbusd`` command and, from their values, makes
the companion (or nothing, when its options are not given). The daemon knows no companion by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

import redis.asyncio as aioredis

from msgbusd.reports.metrics import Metrics
from msgbusd.site.settings import Settings
from twin_resolver.base import Resolver
from wire.envelope import Envelope

ENTRY_POINTS = "msgbusd.companions"


@dataclass(frozen=True)
class SiteHandle:
    """What a companion may use of its site."""

    twin: int
    resolver: Resolver
    metrics: Metrics
    # Take requests as if a local client had pushed them; each one's uids (one per destination), or None
    # for one refused as invalid.
    submit: Callable[[list[Envelope]], Awaitable[list[list[str] | None]]]
    # Take back a request not sent yet (its uid); False when it is on its way or has its outcome.
    withdraw: Callable[[str], Awaitable[bool]]
    # A client of the site's Redis with at most that many connections (the companion closes it).
    open_redis: Callable[[int], aioredis.Redis]


class Companion(Protocol):
    def attach(self, site: SiteHandle) -> None:
        """Called once the site is open, before :meth:`run`."""

    async def run(self, stopping: asyncio.Event) -> None:
        """Work until ``stopping`` is set."""

    async def aclose(self) -> None:
        """Release what the companion holds (called whether it ran or not)."""


class CompanionOptions(Protocol):
    """An entry point of :data:`ENTRY_POINTS`."""

    # A function whose parameters are the companion's options, declared as the ``msgbusd`` command's own
    # (``Annotated[..., typer.Option(...)]`` with their defaults); it is never called.
    options: Callable[..., None]

    def make(self, values: Mapping[str, Any], settings: Settings) -> Companion | None:
        """The companion that ``values`` (this entry's options) ask for, or None; raises
        ``typer.BadParameter`` for options that do not go together, and binds what must be bound before the
        site starts (a busy port is a start-up error)."""


def installed() -> list[CompanionOptions]:
    return [entry.load() for entry in entry_points(group=ENTRY_POINTS)]
