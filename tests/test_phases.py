"""`make test` runs the fault scenarios in a phase of their own that collects only the Makefile's
FAULT_TESTS, and the tests marked `background` beside it from BACKGROUND_TESTS: a test marked for a
phase anywhere else would run in none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def marked_modules(marker: str) -> list[str]:
    """Test modules with ``marker`` on the module (pytestmark) or on a test (a decorator)."""
    marked = re.compile(rf"^(pytestmark\b.*|\s*@)pytest\.mark\.{marker}\b", re.MULTILINE)
    return [
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if marked.search(path.read_text())
    ]


@pytest.mark.parametrize(
    ("marker", "places"), [("faults", "FAULT_TESTS"), ("background", "BACKGROUND_TESTS")]
)
def test_every_test_of_a_phase_is_where_the_phase_looks(marker: str, places: str) -> None:
    found = re.search(rf"^{places} := (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert found is not None, f"the Makefile names where `{marker}` tests are in {places}"
    looked_in = found.group(1).split()
    modules = marked_modules(marker)
    elsewhere = [
        module
        for module in modules
        if not any(module == place or module.startswith(place + "/") for place in looked_in)
    ]
    assert modules and elsewhere == []
