"""Every Redis key of the rules router, in the cloud site's Redis, with its type, writer and reader.

No other router module spells a key literal. ``msgbus rules`` writes the catalog; the router (in msgbusd)
reads it and writes the counters; ``msgbus rules status`` reads those.
"""

from __future__ import annotations

# hash: endpoint name -> the RuleEndpoint as KubeEdge-shaped JSON (sorted keys). Written by apply/delete.
ENDPOINTS = "msgbus.router.endpoints"
# hash: rule name -> the Rule as KubeEdge-shaped JSON (sorted keys). Written by apply/delete.
RULES = "msgbus.router.rules"
# string int: INCR in the same transaction as every change of ENDPOINTS or RULES, so that a reader can
# tell cheaply whether its copy of the catalog is still current.
VERSION = "msgbus.router.version"

# How many of a rule's latest errors are kept.
LAST_ERRORS_KEPT = 20


def counters(rule: str) -> str:
    """hash: fields ``success`` and ``fail`` -> messages of ``rule`` so far (HINCRBY by the router);
    deleted with the rule, kept when it is replaced."""
    return f"msgbus.router.counters.{rule}"


def last_errors(rule: str) -> str:
    """list: JSON ``{"at": unix s, "error": text}`` of ``rule``'s latest failures, newest first, capped at
    LAST_ERRORS_KEPT; deleted with the rule."""
    return f"msgbus.router.errors.{rule}"
