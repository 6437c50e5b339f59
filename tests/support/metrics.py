"""Reading a running daemon's /metrics in tests."""

from __future__ import annotations

import httpx


def scrape(base_url: str) -> dict[str, float]:
    """Every sample of the daemon at ``base_url``, by its name with labels (``name{label="value"}``)."""
    with httpx.Client(base_url=base_url, trust_env=False, timeout=10) as http:
        text = http.get("/metrics").raise_for_status().text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
