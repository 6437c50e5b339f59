from __future__ import annotations

from collections.abc import Iterator

import pytest

from testing.netbed import NetBed, require_netbed


@pytest.fixture(scope="module")
def netbed_reason() -> str | None:
    return require_netbed()


@pytest.fixture
def needs_netbed(netbed_reason: str | None) -> None:
    """Skip, with the reason, where this machine cannot make a network test bed (not root, tools missing)."""
    if netbed_reason is not None:
        pytest.skip(netbed_reason)


@pytest.fixture(scope="module")
def module_bed(netbed_reason: str | None) -> Iterator[NetBed]:
    """One bed for a module's tests; each test switches its faults off again (``with``)."""
    if netbed_reason is not None:
        pytest.skip(netbed_reason)
    with NetBed() as bed:
        yield bed
