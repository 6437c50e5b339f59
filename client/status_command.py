"""``msgbus status``: gather, assess and print a site's status once, or again and again with ``--watch``."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
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
    with _stopped_by_ctrl_c(watch_s is not None) as stopped:
        try:
            while not stopped.is_set():
                status = gather(redis_url, site_url, timeout_s=timeout_s)
                if stopped.is_set():
                    break
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
                stopped.wait(watch_s)
        except KeyboardInterrupt:
            pass
    return code


@contextlib.contextmanager
def _stopped_by_ctrl_c(watching: bool) -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) sets while ``watching``: a watch ends after the sample in progress. A
    KeyboardInterrupt raised in the middle of a library's clean-up can be swallowed there ("Exception
    ignored"), and the watch would go on."""
    stopped = threading.Event()
    if not watching or threading.current_thread() is not threading.main_thread():
        yield stopped
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stopped.set())
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGINT, previous)
