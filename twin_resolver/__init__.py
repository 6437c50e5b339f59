"""Finding twins: their daemon's address and their public key, by id or by account."""

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
from twin_resolver.chain import ChainResolver, Substrate, substrate_connector, twin_from_chain
from twin_resolver.factory import build_resolver
from twin_resolver.http_source import HttpResolver, twin_from_json
from twin_resolver.static import StaticResolver, TwinFileError, load_twin_file, write_twin_file

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
