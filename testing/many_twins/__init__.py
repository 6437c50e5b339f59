"""Many twins in one process: a range of twins, each with its own key, answering a site's requests as that
twin, so that tests and benchmarks can talk to thousands of twins without thousands of processes.

    python -m testing.many_twins --twins twins.json --first 1000 --count 10000 --down 2000

Twin ``N``'s ed25519 key comes from its id alone (:func:`twin_signer`), so any process can compute it.
Every twin has a loopback address of its own (127.1.0.1 for the first, and so on: all of 127.0.0.0/8 is
loopback on Linux), as if each ran its own site: a site keeps only a few connections to one host and port
(``PEER_CONNECTIONS`` in :mod:`msgbusd.site.daemon`), holds one per open link, and asks one address once
whether it takes links. An up twin's address in the twin file is the base URL ``http://127.1.X.Y:PORT/t/N``
(sites use such a URL as it is); a down twin's is the same on ``DOWN_PORT``, which this process holds bound
without listening, so that connecting there is refused. One socket serves every address: it listens on
``PORT`` bound to the loopback interface (``SO_BINDTODEVICE``, Linux 5.7 or later), so nothing beyond this
machine reaches it. ``127.0.0.1:PORT`` serves everything too.

The twins are added to the twin file given (its other entries are kept), and the same file says which site
twins send requests: their keys check the requests, their addresses take the replies.

Served for each up twin ``N``:

``/t/N/zbus-remote``
    go-rmb's checks (JSON, freshness, the source twin's key, the signature) and answers; an accepted
    request is answered as a service would: same uid, ``src`` and ``dst`` swapped, the request's ``dat``
    (or ``--reply-bytes`` bytes), signed by twin N and POSTed to the source site's ``/zbus-reply``.
``/t/N/zbus-reply``
    checked the same way and counted (these twins send no requests, so nothing waits for a reply).
``/t/N/zbus-link``
    the site's half of a link's handshake as twin N; every ``send`` frame is acked with one result per
    message and the replies go back on the link as ``send`` frames (to ``/zbus-reply``), by POST when the
    link breaks first. With ``--no-links`` the upgrade is answered 404, as go-rmb does, and sites POST.
    A request sent again (its answer was lost) is answered again: the site keeps the first reply.
``/t/N/zbus-batch``
    404, as go-rmb: a site then sends one POST per message (and counts a 404 to its probe as an answer).
``/zbus-remote``, ``/zbus-reply`` at twin N's address alone (``http://127.1.X.Y:PORT``)
    the same, for a site that reaches a twin at ``IP:PORT`` and cannot use a path (go-rmb): the twin is
    the one whose address the connection came to.

``GET /stats`` gives the counts as JSON, ``GET /stats?per_twin=1`` each twin's too (see
:meth:`Counts.as_json`); the totals go to stdout on SIGTERM. :class:`ManyTwinsProcess` runs it for tests.
"""

from testing.many_twins.counts import Counts
from testing.many_twins.endpoints import ManyTwins, PendingReply, Settings, TwinLink
from testing.many_twins.process import ManyTwinsProcess
from testing.many_twins.server import READY_LINE, STATS_LINE, serve
from testing.many_twins.twins import TwinRange, add_to_twin_file, twin_entries, twin_signer

__all__ = [
    "READY_LINE",
    "STATS_LINE",
    "Counts",
    "ManyTwins",
    "ManyTwinsProcess",
    "PendingReply",
    "Settings",
    "TwinLink",
    "TwinRange",
    "add_to_twin_file",
    "serve",
    "twin_entries",
    "twin_signer",
]
