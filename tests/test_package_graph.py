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
    assert "wire.envelope" in _graph(None)["msgbusd.handlers"]


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
