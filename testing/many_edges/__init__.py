"""Many edges in one process: a range of twins, each with its own key and no address, each keeping an uplink
to one cloud site, so that tests and benchmarks can put thousands of edges on a site without thousands of
processes.

    python -m testing.many_edges --cloud 1 --twins twins.json --first 100000 --count 10000 --port 9300

Each edge runs msgbusd's own link code (a :class:`~msgbusd.link.links.Links` with ``--uplink CLOUD``):
the real handshake, the real pings, and the same redial policy as a real edge's. Its twin entry has no
address, so the cloud reaches it over its uplink only. An edge answers every request the cloud sends it as
a service would (same uid, ``src`` and ``dst`` swapped, the request's ``dat`` or ``--reply-bytes`` bytes,
signed by the edge) and sends the reply back over its uplink; a request sent again is answered again (the
cloud keeps the first reply). Twin N's key is :func:`testing.many_twins.twin_signer`'s.

Served on ``127.0.0.1:PORT``:

``GET /stats``
    the counts in all: edges, uplinks open, dials and upgrades (handshakes asked for, and taken), requests of
    the cloud answered, requests of the edges sent, refused and answered, and their round trips' p50 and p99;
    ``?opened=1`` adds when each open uplink opened and when each of the last dials was made (unix time).
``POST /send?cmd=C&rate=R[&count=N]``
    requests from the edges to the cloud's service ``C``: one from every edge at once (R = 0), or at R a
    second from edges taken at random among those whose uplink is open.

The totals go to stdout on SIGTERM (:data:`~testing.many_edges.__main__.STATS_LINE`).
:class:`ManyEdgesProcess` runs it for tests.
"""

from testing.many_edges.edges import ManyEdges, edge_entries
from testing.many_edges.process import ManyEdgesProcess
from testing.many_edges.server import READY_LINE, Settings, serve

__all__ = ["READY_LINE", "ManyEdges", "ManyEdgesProcess", "Settings", "edge_entries", "serve"]
