"""The entries of a send queue, read into what goes on the wire.

A send queue holds ``req:<uid>`` (a request for one destination; its envelope is the backlog entry) and
``rep:<key>`` (a service's reply waiting to go back, or at a relay a message it relays; its envelope and
state are stored under the key).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from msgbusd.reports.logs import about
from msgbusd.sending.posts import REMOTE_PATH, REPLY_PATH
from msgbusd.store.queues import Store
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError

log = logging.getLogger("msgbusd.send_items")


def destination_of(uid: str) -> int | None:
    """The twin a ``<dst>.<n>`` uid was issued for, or None for a uid that is not of that form."""
    head, _, tail = uid.partition(".")
    if not tail.isdigit():
        return None
    try:
        return int(head)
    except ValueError:
        return None


@dataclass(frozen=True)
class SendItem:
    """One entry of a send queue, ready to go: the envelope to send and what to do with its outcome."""

    entry: str
    path: str
    envelope: Envelope
    original: Envelope | None = None
    state: dict[str, float] | None = None
    # A request's failed attempts before this send.
    failures: int = 0
    # A message this site relays: signed by its source, sent on as it is (never stamped nor signed here).
    relayed: bool = False

    @property
    def uid(self) -> str:
        return self.entry.removeprefix(keys.REQUEST_PREFIX)

    @property
    def reply_key(self) -> str:
        return self.entry.removeprefix(keys.REPLY_PREFIX)

    @property
    def is_request(self) -> bool:
        return self.original is not None


class SendItems:
    """Builds the items of send-queue entries for this site's twin."""

    def __init__(self, store: Store, twin: int) -> None:
        self._store = store
        self._twin = twin

    async def read(self, entries: list[str]) -> list[SendItem]:
        """The entries that still have something to send (finished ones are left out), in one round trip."""
        items = []
        for entry, (first, second) in zip(
            entries, await self._store.load_entries(entries, attempts=True), strict=True
        ):
            item = await self._item(entry, first, second)
            if item is not None:
                items.append(item)
        return items

    @staticmethod
    def pack(items: Sequence[SendItem]) -> bytes:
        """``items`` as bytes for another instance of the site (:meth:`unpack`): per item, a line with its
        entry and its request's failures or its reply's state, and a line with its envelope (compact JSON
        has no raw newline)."""
        lines = []
        for item in items:
            extra: int | dict[str, float] | None = item.failures if item.is_request else item.state
            lines.append(json.dumps([item.entry, extra], separators=(",", ":")).encode())
            lines.append((item.original or item.envelope).encode())
        return b"\n".join(lines)

    def unpack(self, data: bytes) -> list[SendItem]:
        """The items :meth:`pack` gave; raises ValueError for anything else."""
        lines = data.split(b"\n")
        if len(lines) % 2:
            raise ValueError("an item without its envelope")
        items = []
        for head, body in zip(lines[::2], lines[1::2], strict=True):
            described = json.loads(head)
            if not (isinstance(described, list) and len(described) == 2 and isinstance(described[0], str)):
                raise ValueError(f"not an entry: {described!r}")
            entry, extra = described
            env = Envelope.decode(body)
            uid = entry.removeprefix(keys.REQUEST_PREFIX)
            is_request = entry.startswith(keys.REQUEST_PREFIX) and destination_of(uid) is not None
            if is_request and isinstance(extra, int):
                items.append(self.request(uid, env, extra))
            elif entry.startswith(keys.REPLY_PREFIX) and isinstance(extra, dict):
                items.append(self.reply(entry.removeprefix(keys.REPLY_PREFIX), env, extra))
            else:
                raise ValueError(f"entry {entry!r} with {extra!r} is neither a request nor a reply")
        return items

    def request(self, uid: str, original: Envelope, failures: int = 0) -> SendItem:
        return SendItem(
            keys.REQUEST_PREFIX + uid,
            REMOTE_PATH,
            self.forwarded_copy(original, uid, failures),
            original=original,
            failures=failures,
        )

    @staticmethod
    def reply(key: str, env: Envelope, state: dict[str, float]) -> SendItem:
        """A service's reply to send back, or (kept under a :func:`wire.keys.relayed_key`) a message this
        site relays."""
        relayed_request = keys.relayed_is_request(key)
        if relayed_request is None:
            return SendItem(keys.REPLY_PREFIX + key, REPLY_PATH, env, state=state)
        path = REMOTE_PATH if relayed_request else REPLY_PATH
        return SendItem(keys.REPLY_PREFIX + key, path, env, state=state, relayed=True)

    def forwarded_copy(self, original: Envelope, uid: str, failures: int) -> Envelope:
        """What goes over the wire for one destination: its own uid, our twin as src, tries left."""
        dst = destination_of(uid)
        assert dst is not None, uid
        return original.replace(
            uid=uid,
            src=self._twin,
            dst=(dst,),
            ret=keys.REPLY,
            retries=max(0, original.retries - failures),
            pxy=False,
            err="",
            sig="",
        )

    async def _item(self, entry: str, first: bytes | None, second: bytes | None) -> SendItem | None:
        """The item of send-queue ``entry``: ``first`` and ``second`` are a reply's payload and state, or a
        request's backlog entry and failed attempts."""
        if entry.startswith(keys.REPLY_PREFIX):
            key = entry.removeprefix(keys.REPLY_PREFIX)
            if first is None:
                return None
            try:
                env = Envelope.decode(first)
            except EnvelopeDecodeError as exc:
                await self._store.forget_reply(key)
                log.error("dropped unreadable pending reply %s: %s", key, exc.reason)
                return None
            return self.reply(key, env, json.loads(second) if second else {})
        uid = entry.removeprefix(keys.REQUEST_PREFIX)
        original = await self._original_from(uid, first)
        return None if original is None else self.request(uid, original, int(second or 0))

    async def _original_from(self, uid: str, entry: bytes | None) -> Envelope | None:
        """The decoded backlog ``entry`` of ``uid``; None when it is gone (the request has its outcome, and
        the script that gave it cleaned its bookkeeping) or unreadable (its bookkeeping cleaned here)."""
        if entry is None:
            return None
        try:
            return Envelope.decode(entry)
        except EnvelopeDecodeError as exc:
            log.error(
                "backlog entry of uid=%s is unreadable (%s); dropping it",
                uid,
                exc.reason,
                extra=about(uid=uid),
            )
            await self._store.forget_request(uid)
            return None
