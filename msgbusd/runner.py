"""Turn :class:`Settings` into a running site: identity, resolver, then the daemon. Errors become one line."""

from __future__ import annotations

import logging
import sys

from msgbusd.daemon import StartupError, serve
from msgbusd.identity import IdentityError, load_signer
from msgbusd.settings import Settings
from twin_resolver.base import Resolver
from twin_resolver.static import StaticResolver, TwinFileError

log = logging.getLogger("msgbusd")


def build_resolver(settings: Settings) -> Resolver:
    if settings.twins_file is not None:
        try:
            return StaticResolver(settings.twins_file)
        except TwinFileError as exc:
            raise StartupError(str(exc)) from exc
    raise StartupError(
        f"resolving twins through the chain ({settings.substrate_url}) is not available in this version; "
        "give a twin map with --twins FILE"
    )


async def run(settings: Settings) -> None:
    """Run until stopped; exits the process with status 1 and a one-line message on a start-up error."""
    try:
        try:
            signer = load_signer(settings.mnemonics, settings.key_type)
        except IdentityError as exc:
            raise StartupError(str(exc)) from exc
        resolver = build_resolver(settings)
        try:
            await serve(settings, signer, resolver)
        finally:
            await resolver.aclose()
    except StartupError as exc:
        print(f"msgbusd: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
