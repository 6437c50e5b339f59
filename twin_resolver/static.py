"""Twins from a JSON file, for sites that do not use the chain, and for tests and demos.

The file is ``{"twins": [{"id": 1, "ip": "300:1::2", "account": "<64 hex or SS58>", "name": "edge-1"}]}``
(``name`` optional). It is re-read when it changes, so operators can add twins without a restart.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from twin_resolver.accounts import account_from_text, relay_fields
from twin_resolver.base import AccountNotFound, Twin, TwinNotFound

log = logging.getLogger(__name__)

StrPath = str | os.PathLike[str]


class TwinFileError(ValueError):
    """A twin file that cannot be used; the message names the file and, if relevant, the entry."""


class StaticResolver:
    """A :class:`~twin_resolver.base.Resolver` over a fixed set of twins, optionally backed by a file."""

    def __init__(
        self,
        path: StrPath,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Load ``path`` now (raising :class:`TwinFileError` if it is unusable) and watch it for changes."""
        self._path: Path | None = Path(path)
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._version = _file_version(self._path)
        self._set(load_twin_file(self._path))
        self._next_check = clock() + check_interval_s

    @classmethod
    def from_twins(cls, twins: Iterable[Twin]) -> StaticResolver:
        """A resolver over ``twins``, with no file behind it."""
        resolver = cls.__new__(cls)
        resolver._path = None
        resolver._set(_index(list(twins), "twins"))
        return resolver

    async def get_twin(self, twin_id: int) -> Twin:
        """The twin with this id, or :class:`TwinNotFound`."""
        self._maybe_reload()
        twin = self._twins.get(twin_id)
        if twin is None:
            raise TwinNotFound(twin_id)
        return twin

    async def twin_id_by_public_key(self, public_key: bytes) -> int:
        """The id of the twin with this account, or :class:`AccountNotFound`."""
        self._maybe_reload()
        twin_id = self._ids.get(bytes(public_key))
        if twin_id is None:
            raise AccountNotFound(public_key)
        return twin_id

    async def twin_id_by_name(self, name: str) -> int | None:
        """The id of the twin the file calls ``name``, or None (names are a convenience of twin files)."""
        self._maybe_reload()
        return self._names.get(name)

    async def aclose(self) -> None:
        """Nothing to release."""

    def _set(self, twins: Mapping[int, Twin]) -> None:
        self._twins = dict(twins)
        self._ids = {twin.public_key: twin.id for twin in twins.values()}
        self._names = {twin.name: twin.id for twin in twins.values() if twin.name is not None}

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self._check_interval_s
        version = _file_version(self._path)
        if version == self._version:
            return
        # Remember the version even if loading fails, so a broken file is reported once, not every second.
        self._version = version
        try:
            twins = load_twin_file(self._path)
        except TwinFileError as exc:
            log.warning("keeping the previous %d twins: %s", len(self._twins), exc)
            return
        self._set(twins)
        log.info("reloaded %d twins from %s", len(twins), self._path)


def load_twin_file(path: StrPath) -> dict[int, Twin]:
    """Read and check a twin file; :class:`TwinFileError` names the file and the bad entry."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TwinFileError(f"{path}: twin file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TwinFileError(f"{path}: cannot read twin file: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TwinFileError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("twins"), list):
        raise TwinFileError(f'{path}: expected an object with a "twins" list')
    return _index([_parse_entry(entry, f"{path}: twins[{i}]") for i, entry in enumerate(doc["twins"])], path)


def write_twin_file(path: StrPath, twins: Iterable[Twin]) -> None:
    """Write ``twins`` in the twin file format (atomically, so a watching resolver never sees half a file)."""
    entries: list[dict[str, Any]] = []
    for twin in twins:
        entry: dict[str, Any] = {"id": twin.id, "ip": twin.address, "account": twin.public_key.hex()}
        if twin.name is not None:
            entry["name"] = twin.name
        if twin.relay:
            entry["relay"] = twin.relay
        if twin.encryption_key is not None:
            entry["pk"] = twin.encryption_key.hex()
        entries.append(entry)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps({"twins": entries}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def _parse_entry(entry: Any, where: str) -> Twin:
    if not isinstance(entry, dict):
        raise TwinFileError(f"{where}: expected an object")
    missing = [key for key in ("id", "ip", "account") if key not in entry]
    if missing:
        raise TwinFileError(f"{where}: missing key(s) {', '.join(missing)}")
    twin_id, ip, account, name = entry["id"], entry["ip"], entry["account"], entry.get("name")
    if not isinstance(twin_id, int) or isinstance(twin_id, bool) or twin_id <= 0:
        raise TwinFileError(f"{where}: id must be a positive integer, got {twin_id!r}")
    if not isinstance(ip, str):
        raise TwinFileError(f"{where}: ip must be a string, got {ip!r}")
    if not isinstance(account, str):
        raise TwinFileError(f"{where}: account must be a string, got {account!r}")
    try:
        public_key = account_from_text(account)
    except ValueError as exc:
        raise TwinFileError(f"{where}: bad account: {exc}") from None
    if name is not None and not isinstance(name, str):
        raise TwinFileError(f"{where}: name must be a string, got {name!r}")
    try:
        relay, encryption_key = relay_fields(entry)
    except ValueError as exc:
        raise TwinFileError(f"{where}: {exc}") from None
    return Twin(
        id=twin_id,
        address=ip,
        public_key=public_key,
        name=name,
        relay=relay,
        encryption_key=encryption_key,
    )


def _index(twins: list[Twin], source: StrPath) -> dict[int, Twin]:
    by_id: dict[int, int] = {}
    by_account: dict[bytes, int] = {}
    by_name: dict[str, int] = {}
    for i, twin in enumerate(twins):
        where = f"{source}: twins[{i}]"
        if twin.id in by_id:
            raise TwinFileError(f"{where}: duplicate twin id {twin.id} (also twins[{by_id[twin.id]}])")
        if twin.public_key in by_account:
            raise TwinFileError(f"{where}: account already used by twins[{by_account[twin.public_key]}]")
        if twin.name is not None and twin.name in by_name:
            raise TwinFileError(f"{where}: name {twin.name!r} already used by twins[{by_name[twin.name]}]")
        by_id[twin.id] = i
        by_account[twin.public_key] = i
        if twin.name is not None:
            by_name[twin.name] = i
    return {twin.id: twin for twin in twins}


def _file_version(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
