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
from twin_resolver.cache import CachedResolver
from twin_resolver.static import StaticResolver, TwinFileError, load_twin_file, write_twin_file

__all__ = [
    "AccountNotFound",
    "CachedResolver",
    "Resolver",
    "ResolverError",
    "ResolverUnavailable",
    "StaticResolver",
    "Twin",
    "TwinFileError",
    "TwinNotFound",
    "load_twin_file",
    "peer_url",
    "write_twin_file",
]
