"""Which of the project's packages import which, read from the source (imports inside functions count)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wire", "msgbusd", "client", "twin_resolver", "spark", "router", "bench", "testing")
# Product code: what an installed site runs.
PRODUCT = ("wire", "msgbusd", "client", "twin_resolver", "spark", "router")
# The client's commands that start or set up a daemon, and the demo, which runs two.
CLIENT_DAEMON_COMMANDS = ("client.cli", "client.demo")
# The rooms of msgbusd, bottom to top, and what each may import of msgbusd: only rooms below it, and
# msgbusd.errors. Each room's __init__ says the same in its "May import from msgbusd:" line.
ROOMS = {
    "reports": set(),
    "identity": set(),
    "store": set(),
    "link": {"errors", "reports", "identity", "store"},
    "sending": {"errors", "reports", "identity", "store", "link"},
    "door": {"errors", "reports", "identity", "store", "link", "sending"},
    "site": {"errors", "reports", "identity", "store", "link", "sending", "door"},
    "gateway": {"errors", "reports", "site"},
}
# Beside the rooms: the exceptions every room raises, and the command (``msgbusd``, ``python -m msgbusd``).
BESIDE_THE_ROOMS = {"errors": set(), "command": {"site"}, "__main__": {"command"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """The project modules ``path`` imports."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name:
                yield name


@functools.cache
def _graph(level: int | None) -> dict[str, set[str]]:
    """Module -> modules it imports; with ``level`` 1, top-level package -> packages."""
    edges: dict[str, set[str]] = {}

    def cut(name: str) -> str:
        return ".".join(name.split(".")[:level]) if level else name

    for module, path in MODULES.items():
        targets = edges.setdefault(cut(module), set())
        targets.update(cut(target) for target in _imports(path) if cut(target) != cut(module))
    return edges


def _cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    packages = _graph(1)
    assert "wire" in packages["client"] and "twin_resolver" in packages["msgbusd"]
    assert "wire.envelope" in _graph(None)["msgbusd.door.handlers"]


def test_neither_packages_nor_modules_import_each_other_in_a_cycle() -> None:
    assert _cycles(_graph(1)) == set()
    assert _cycles(_graph(None)) == set()


def test_cycles_are_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset({"a", "b", "c"})}


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_does_not_import_the_benchmarks_or_the_tests(package: str) -> None:
    assert not _graph(1)[package] & {"bench", "tests"}


def test_the_daemon_is_the_rmb_daemon_alone() -> None:
    """The rules router runs beside it as a companion (an entry point); the daemon names neither it nor the
    client."""
    assert _graph(1)["msgbusd"] == {"twin_resolver", "wire"}


def test_the_wire_layer_imports_nothing_else_of_msgbus() -> None:
    assert _graph(1)["wire"] == set()


def test_the_client_library_and_the_miner_need_only_the_wire_layer() -> None:
    """An app that calls or serves commands installs no daemon; the Spark job reads the event log's
    schema from the wire layer."""
    needs = {
        module: {target.split(".")[0] for target in targets} - {module.split(".")[0]}
        for module, targets in _graph(None).items()
        if module.split(".")[0] in ("client", "spark") and module not in CLIENT_DAEMON_COMMANDS
    }
    assert {module: packages for module, packages in needs.items() if packages - {"wire", "client"}} == {}


def test_the_resolver_stands_alone() -> None:
    """A twin resolver needs nothing of the daemon (SS58 helpers live in twin_resolver.accounts)."""
    assert _graph(1)["twin_resolver"] == set()


def test_only_the_demo_uses_the_launchers() -> None:
    users = {
        module for module, targets in _graph(None).items() if any(t.startswith("testing") for t in targets)
    }
    assert {user for user in users if user.split(".")[0] in PRODUCT} == {"client.demo"}


def _daemon_parts() -> dict[str, set[str]]:
    """Each room of msgbusd, and each module beside them -> the rooms and modules of msgbusd it imports."""
    return {
        source.removeprefix("msgbusd."): {
            target.removeprefix("msgbusd.") for target in targets if target.startswith("msgbusd.")
        }
        for source, targets in _graph(2).items()
        if source.startswith("msgbusd.")
    }


def _not_allowed(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    allowed = ROOMS | BESIDE_THE_ROOMS
    return {part: targets - allowed[part] for part, targets in imports.items() if targets - allowed[part]}


def test_every_module_of_the_daemon_is_in_a_room_or_declared_beside_them() -> None:
    assert set(_daemon_parts()) == set(ROOMS) | set(BESIDE_THE_ROOMS)


def test_a_room_imports_nothing_above_it() -> None:
    order = list(ROOMS)
    above = {
        room: {other for other in allowed - {"errors"} if order.index(other) > order.index(room)}
        for room, allowed in ROOMS.items()
    }
    assert {room: rooms for room, rooms in above.items() if rooms} == {}
    assert _not_allowed(_daemon_parts()) == {}
    assert "sending" in _daemon_parts()["door"] and "door" in _daemon_parts()["site"]


def test_an_import_upward_is_found() -> None:
    imports = _daemon_parts() | {"reports": {"sending"}, "errors": {"site"}}
    assert _not_allowed(imports) == {"reports": {"sending"}, "errors": {"site"}}


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_says_what_it_is_for_and_what_it_may_import(room: str) -> None:
    init = ROOT / "msgbusd" / room / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    declared = [line for line in doc.splitlines() if line.startswith("May import from msgbusd:")]
    assert len(declared) == 1 and not doc.startswith("May import"), (
        f"{init} has no purpose or no imports line"
    )
    names = declared[0].partition(":")[2].strip().rstrip(".")
    assert (set() if names == "nothing" else set(names.split(", "))) == ROOMS[room]
