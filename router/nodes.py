"""Node names of rules to twin ids: a number is a twin id; a name is looked up in the twin file."""

from __future__ import annotations

from twin_resolver.base import Resolver


class UnknownNode(LookupError):
    """A node name that maps to no twin; ``str()`` says why."""


async def node_twin(resolver: Resolver, node: str) -> int:
    """The twin id of ``node`` (raises :class:`UnknownNode`)."""
    if node.isdigit():
        return int(node)
    by_name = getattr(resolver, "twin_id_by_name", None)
    if by_name is None:
        raise UnknownNode(
            f"node {node!r} is not a twin id, and the twin source has no names: use the node's twin id"
        )
    twin = await by_name(node)
    if twin is None:
        raise UnknownNode(f"no twin is called {node!r} in the twin file")
    return int(twin)
