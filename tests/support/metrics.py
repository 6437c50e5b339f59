"""Reading a running daemon's /metrics in tests."""

from __future__ import annotations

import re

import httpx

# Each process's figures carry its instance id; the tests read them by name and their other labels.
_INSTANCE = re.compile(r',?instance="[^"]*"')


def samples(text: str) -> dict[str, float]:
    """Every sample of an exposition, by its name with labels (``name{label="value"}``), without the
    ``instance`` label."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = _INSTANCE.sub("", name).replace("{,", "{").replace("{}", "")
            found[name] = float(value)
    return found


def scrape(base_url: str) -> dict[str, float]:
    """:func:`samples` of the daemon at ``base_url``."""
    with httpx.Client(base_url=base_url, trust_env=False, timeout=10) as http:
        return samples(http.get("/metrics").raise_for_status().text)
