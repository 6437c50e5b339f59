"""Choosing the twin source from the command line: a twin file, the chain, or an HTTP source."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from twin_resolver.base import Resolver
from twin_resolver.cache import CachedResolver, StaleHook
from twin_resolver.static import StaticResolver


def build_resolver(
    substrate_url: str | None,
    twins_file: Path | None,
    *,
    ttl_s: float = 300.0,
    negative_ttl_s: float = 10.0,
    stale_for_s: float = 3600.0,
    timeout_s: float = 10.0,
    on_stale: StaleHook | None = None,
) -> Resolver:
    """The resolver for these options.

    A ``twins_file`` wins (the file is held in memory, so it is not cached; :class:`TwinFileError` if it is
    unusable). Otherwise ``substrate_url`` picks the chain (``ws://``, ``wss://``) or an HTTP twin source
    (``http://``, ``https://``), behind a :class:`CachedResolver`. Nothing is contacted until the first
    look-up. ``ValueError`` for a missing or unsupported URL.
    """
    if twins_file is not None:
        return StaticResolver(twins_file)
    if not substrate_url:
        raise ValueError("no twin source: give a twin file (--twins FILE) or a chain URL (--substrate URL)")
    scheme = urlsplit(substrate_url).scheme.lower()
    inner: Resolver
    # The chain's and the HTTP source's modules are imported here: their clients (websocket-client, httpx
    # and what it imports) cost every daemon's start, and most sites read a twin file.
    if scheme in ("ws", "wss"):
        from twin_resolver.chain import ChainResolver

        inner = ChainResolver(substrate_url, timeout_s=timeout_s)
    elif scheme in ("http", "https"):
        from twin_resolver.http_source import HttpResolver

        inner = HttpResolver(substrate_url, timeout_s=timeout_s)
    else:
        raise ValueError(
            f"unsupported twin source URL {substrate_url!r}: use ws:// or wss:// for the chain, "
            "http:// or https:// for an HTTP twin source"
        )
    return CachedResolver(
        inner, ttl_s=ttl_s, negative_ttl_s=negative_ttl_s, stale_for_s=stale_for_s, on_stale=on_stale
    )
