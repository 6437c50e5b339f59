"""`make test` runs the fault scenarios in a phase of their own that collects only the Makefile's
FAULT_TESTS: a scenario anywhere else would run in neither phase."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A module's mark (pytestmark) or a test's (a decorator).
MARKED = re.compile(r"^(pytestmark\b.*|\s*@)pytest\.mark\.faults\b", re.MULTILINE)


def test_every_fault_scenario_is_where_the_fault_phase_looks() -> None:
    found = re.search(r"^FAULT_TESTS := (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert found is not None, "the Makefile names the fault phase's tests in FAULT_TESTS"
    places = found.group(1).split()
    scenarios = [
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if MARKED.search(path.read_text())
    ]
    elsewhere = [
        module
        for module in scenarios
        if not any(module == place or module.startswith(place + "/") for place in places)
    ]
    assert scenarios and elsewhere == []
