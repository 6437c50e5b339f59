"""How other sites answer this one: at the address its twin entry gives, through the relay it names, or,
for a twin with neither (an edge behind NAT, ``"ip": ""``), only over a link this site opened to them.

Such a site reaches every msgbus site over a link, never in a POST, and keeps the link open while answers
may still come over it; a request to a site that takes no links (go-rmb, ``--no-links``) could never be
answered, and is refused at once with :func:`no_way_back`.
"""

from __future__ import annotations

from msgbusd.errors import DeliveryError
from twin_resolver.base import Resolver, ResolverError, Twin


def reached_only_over_its_links(twin: Twin) -> bool:
    """``twin``'s entry gives neither an address nor a relay: other sites answer it only over links it
    opened to them."""
    return not twin.address.strip() and not twin.relay


class WayBack:
    """Whether this site's twin can be answered only over links it opens itself."""

    def __init__(self, twin: int, resolver: Resolver) -> None:
        self.twin = twin
        self._resolver = resolver

    async def only_over_links(self) -> bool:
        """This site's twin entry gives neither an address nor a relay (looked up each time: the resolver
        caches it, and an operator may give the twin an address later)."""
        try:
            own = await self._resolver.get_twin(self.twin)
        except ResolverError:
            return False
        return reached_only_over_its_links(own)


def no_way_back(own_twin: int, dst: int, *, links_off: bool) -> DeliveryError:
    """The final error of a request whose answer could not come back to this site."""
    if links_off:
        why = f"this site runs with --no-links, so twin {dst} has no link to answer twin {own_twin} over"
    else:
        why = f"twin {dst}'s site takes no links (it is not a msgbus site, or runs with --no-links)"
    return DeliveryError(
        f"{why}, and twin {own_twin} has neither an address nor a relay in its twin entry: "
        "the answer could not come back",
        kind="refused",
        final=True,
    )
