"""``msgbus status``: gather, assess and print a site's status once, or again and again with ``--watch``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import IO

from client.status import gather
from client.status_check import assess
from client.status_render import render_json, render_table, wants_colour

CLEAR_SCREEN = "\033[H\033[2J"
# What an interrupted watch exits with when it had no sample yet (as a shell reports SIGINT).
INTERRUPTED = 130


def show_status(
    redis_url: str,
    site_url: str,
    *,
    as_json: bool,
    watch_s: float | None,
    timeout_s: float,
    out: IO[str],
    environ: Mapping[str, str],
) -> int:
    """Print the site's status (every ``watch_s`` until Ctrl-C, if given); returns the exit status of the
    last sample."""
    colour = wants_colour(out, environ)
    redraw = watch_s is not None and not as_json and out.isatty()
    code = INTERRUPTED
    try:
        while True:
            status = gather(redis_url, site_url, timeout_s=timeout_s)
            verdict = assess(status)
            code = verdict.exit_code
            if as_json:
                text = render_json(status, verdict) + "\n"
            else:
                text = render_table(status, verdict, colour=colour)
            if redraw:
                text = f"{CLEAR_SCREEN}{text}\nrefreshing every {watch_s:g}s; Ctrl-C to stop\n"
            out.write(text)
            out.flush()
            if watch_s is None:
                return code
            time.sleep(watch_s)
    except KeyboardInterrupt:
        return code
