"""The daemon's limit on open files. Every peer it talks to at once holds a socket (its link, or a connection
kept alive for its POSTs), so a site that talks to thousands of twins needs more than the usual soft limit
of 1,024: at start the soft limit is raised to the hard one, as Go programs (go-rmb among them) do."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("msgbusd")

# Where the soft limit goes when the hard one is unlimited (the kernel's default cap, fs.nr_open).
UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard limit, if it is lower; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
            return soft
        log.info("raised the open files limit from %d to %d", soft, target)
        return target
    return soft
