"""Finding twins: their daemon's address and their public key, by id or by account."""

import importlib
from typing import TYPE_CHECKING, Any

from twin_resolver.address import peer_url
from twin_resolver.base import (
    AccountNotFound,
    Resolver,
    ResolverError,
    ResolverUnavailable,
    Twin,
    TwinNotFound,
)
from twin_resolver.cache import CachedResolver, CacheStats, StaleHook
from twin_resolver.factory import build_resolver
from twin_resolver.static import StaticResolver, TwinFileError, load_twin_file, write_twin_file

if TYPE_CHECKING:
    from twin_resolver.chain import ChainResolver, Substrate, substrate_connector, twin_from_chain
    from twin_resolver.http_source import HttpResolver, twin_from_json

__all__ = [
    "AccountNotFound",
    "CacheStats",
    "CachedResolver",
    "ChainResolver",
    "HttpResolver",
    "Resolver",
    "ResolverError",
    "ResolverUnavailable",
    "StaleHook",
    "StaticResolver",
    "Substrate",
    "Twin",
    "TwinFileError",
    "TwinNotFound",
    "build_resolver",
    "load_twin_file",
    "peer_url",
    "substrate_connector",
    "twin_from_chain",
    "twin_from_json",
    "write_twin_file",
]

# The chain and the HTTP source are loaded when first asked for: their clients (websocket-client, httpx)
# cost every daemon's start, and most sites read a twin file.
_LOADED_WHEN_ASKED = {
    "ChainResolver": "twin_resolver.chain",
    "Substrate": "twin_resolver.chain",
    "substrate_connector": "twin_resolver.chain",
    "twin_from_chain": "twin_resolver.chain",
    "HttpResolver": "twin_resolver.http_source",
    "twin_from_json": "twin_resolver.http_source",
}


def __getattr__(name: str) -> Any:
    if name in _LOADED_WHEN_ASKED:
        return getattr(importlib.import_module(_LOADED_WHEN_ASKED[name]), name)
    raise AttributeError(f"module 'twin_resolver' has no attribute {name!r}")
