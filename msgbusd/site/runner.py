"""Turn :class:`Settings` into a running site: identity, resolver, then the daemon. Errors become one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from msgbusd.errors import StartupError
from msgbusd.identity.keys import IdentityError, load_signer
from msgbusd.site.companions import Companion
from msgbusd.site.daemon import serve
from msgbusd.site.settings import Settings
from twin_resolver.base import Resolver
from twin_resolver.factory import build_resolver as resolver_from
from twin_resolver.static import TwinFileError

log = logging.getLogger("msgbusd")


def build_resolver(settings: Settings) -> Resolver:
    """The twin map when given, else the chain (ws/wss) or an HTTP twin source, behind a cache."""
    try:
        return resolver_from(
            settings.substrate_url,
            settings.twins_file,
            ttl_s=settings.twin_cache_ttl_s,
            negative_ttl_s=settings.twin_negative_ttl_s,
            stale_for_s=settings.twin_stale_for_s,
            timeout_s=settings.twin_lookup_timeout_s,
        )
    except (TwinFileError, ValueError) as exc:
        raise StartupError(str(exc)) from exc


async def run(settings: Settings, companions: Sequence[Companion] = ()) -> None:
    """Run the site and its ``companions`` until stopped; exits the process with status 1 and a one-line
    message on a start-up error."""
    try:
        try:
            signer = load_signer(settings.mnemonics, settings.key_type)
        except IdentityError as exc:
            raise StartupError(str(exc)) from exc
        resolver = build_resolver(settings)
        try:
            await serve(settings, signer, resolver, companions)
        finally:
            await resolver.aclose()
    except StartupError as exc:
        print(f"msgbusd: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
