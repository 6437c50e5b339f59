"""The twins themselves: each one's key (from its id alone, so every process computes the same), the range
of them with the ones that are down, each one's loopback address, and their entries in a twin file."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from msgbusd.identity.signing import Signer
from twin_resolver.base import Twin
from twin_resolver.static import load_twin_file, write_twin_file

# Twin N's key is the ed25519 key of blake2b(KEY_PREFIX + "N").
KEY_PREFIX = b"msgbus many twins\n"
# The address of the first twin; the next ones take the addresses after it.
FIRST_HOST = ipaddress.IPv4Address("127.1.0.1")
# Where the counts are served, and everything else too.
CONTROL_HOST = "127.0.0.1"


def twin_signer(twin_id: int) -> Signer:
    """Twin ``twin_id``'s key (the same in every process)."""
    seed = hashlib.blake2b(KEY_PREFIX + str(twin_id).encode(), digest_size=32).digest()
    return Signer(seed, "ed25519")


@dataclass(frozen=True)
class TwinRange:
    """Twins ``first`` to ``first + count - 1``; those in ``down`` have an address where nothing listens."""

    first: int
    count: int
    down: frozenset[int] = frozenset()

    @classmethod
    def of(cls, first: int, count: int, down_last: int = 0, down_ids: Iterable[int] = ()) -> TwinRange:
        """The range, with its last ``down_last`` twins and the twins ``down_ids`` down."""
        if first < 1 or not 1 <= count <= 2**24 - 2**16 - 1 or not 0 <= down_last <= count:
            raise ValueError(f"bad twin range: first {first}, count {count}, {down_last} down")
        down = set(range(first + count - down_last, first + count)) | set(down_ids)
        outside = sorted(twin for twin in down if not first <= twin < first + count)
        if outside:
            raise ValueError(f"down twins {outside} are not in {first}..{first + count - 1}")
        return cls(first, count, frozenset(down))

    def host_of(self, twin: int) -> str:
        """``twin``'s loopback address."""
        return str(FIRST_HOST + (twin - self.first))

    def twin_at(self, host: str) -> int | None:
        """The twin whose loopback address is ``host``, if any."""
        try:
            twin = self.first + (int(ipaddress.IPv4Address(host)) - int(FIRST_HOST))
        except ValueError:
            return None
        return twin if twin in self.ids else None

    @property
    def ids(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def up_ids(self) -> list[int]:
        return [twin for twin in self.ids if twin not in self.down]


def twin_entries(twins: TwinRange, port: int, down_port: int, signers: Mapping[int, Signer]) -> list[Twin]:
    """The twin file's entries of ``twins``, served on ``port`` (up) or refused on ``down_port`` (down)."""
    return [
        Twin(
            id=twin,
            address=f"{_base_url(twins, twin, port, down_port)}/t/{twin}",
            public_key=signer.public_key,
        )
        for twin, signer in ((twin, signers[twin]) for twin in twins.ids)
    ]


def _base_url(twins: TwinRange, twin: int, port: int, down_port: int) -> str:
    return f"http://{twins.host_of(twin)}:{down_port if twin in twins.down else port}"


def add_to_twin_file(path: Path, twins: Sequence[Twin]) -> bool:
    """Put ``twins`` in the twin file at ``path`` (replacing entries with their ids, keeping the others);
    False when they were all there already, and the file was left alone (sites reload a changed file)."""
    existing = load_twin_file(path) if path.exists() else {}
    if all(existing.get(twin.id) == twin for twin in twins):
        return False
    ours = {twin.id for twin in twins}
    write_twin_file(path, [*(twin for twin in existing.values() if twin.id not in ours), *twins])
    return True
