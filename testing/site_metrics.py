"""A daemon's figures as a test or a benchmark reads them: one sample of its ``/metrics``, and its peers
from ``/status``."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from testing.local_sites import SiteProcess


def metric(site: SiteProcess, name: str, **labels: str) -> float | None:
    """One sample of ``site``'s ``/metrics`` (served to the machine itself), or None if it is not there."""
    response = httpx.get(f"{site.url}/metrics", timeout=10.0, trust_env=False)
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def peers_probed(site: SiteProcess) -> int:
    """How many of ``site``'s peers are down and have failed at least one probe (``/status``)."""
    response = httpx.get(f"{site.url}/status", timeout=10.0, trust_env=False)
    response.raise_for_status()
    return sum(
        1 for peer in response.json()["peers"] if peer["state"] == "down" and peer.get("probes", 0) >= 1
    )


def samples(site: SiteProcess, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` in ``site``'s ``/metrics``, by its labels."""
    response = httpx.get(f"{site.url}/metrics", timeout=10.0, trust_env=False)
    response.raise_for_status()
    return {
        tuple(sorted(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name
    }


def histogram(site: SiteProcess, name: str, **labels: str) -> dict[float, float]:
    """The cumulative buckets of histogram ``name`` (its ``le`` bounds, +Inf included, to the observations
    at most that large) in ``site``'s ``/metrics``, summed over the series whose labels match ``labels``."""
    buckets: dict[float, float] = {}
    for key, value in samples(site, f"{name}_bucket").items():
        found = dict(key)
        if all(found.get(k) == v for k, v in labels.items()):
            le = float(found["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    return dict(sorted(buckets.items()))


def stalls(before: dict[float, float], after: dict[float, float], over_s: float) -> tuple[int, float]:
    """Between two readings of a histogram of pauses: how many were longer than ``over_s`` (a bucket
    bound), and the bound the longest one was under (inf: over the largest)."""
    grown = {le: after[le] - before.get(le, 0.0) for le in after}
    total = grown.get(float("inf"), 0.0)
    longer = int(total - grown.get(over_s, total))
    worst = next((le for le, count in grown.items() if count >= total), float("inf")) if total else 0.0
    return longer, worst
