"""Every Redis key of the rules router (catalog and counters in the cloud site's Redis, routing state in
both sites), with its type, writer and reader.

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
# string: a random id given to the catalog by its first change (SETNX), so that an edge can tell a catalog
# started anew (a Redis wiped, versions counting from 1 again) from an older answer of the same one.
EPOCH = "msgbus.router.epoch"

# How many of a rule's latest errors are kept.
LAST_ERRORS_KEPT = 20


def counters(rule: str) -> str:
    """hash: fields ``success`` and ``fail`` -> messages of ``rule`` so far, ``superseded`` -> keyed messages
    dropped for a newer one, ``retries`` -> failed attempts that were tried again (HINCRBY by the router);
    deleted with the rule, kept when it is replaced."""
    return f"msgbus.router.counters.{rule}"


def last_errors(rule: str) -> str:
    """list: JSON ``{"at": unix s, "error": text}`` of ``rule``'s latest failures, newest first, capped at
    LAST_ERRORS_KEPT; deleted with the rule."""
    return f"msgbus.router.errors.{rule}"


# --- routing state (cloud site) -------------------------------------------------------------------------


def pending(uid: str) -> str:
    """string, TTL = the message's lifetime + a margin: JSON ``{"rule", "twin", "key"}`` of a message
    sent to an edge (by its bus uid) whose outcome is not counted yet; deleted by the one who counts it."""
    return f"msgbus.router.pending.{uid}"


def early_outcome(uid: str) -> str:
    """string, TTL 60 s: JSON ``{"field", "entry"}`` of a reply that came before its pending record was
    written; the writer counts it."""
    return f"msgbus.router.early.{uid}"


def latest(twin: int) -> str:
    """hash: X-Msgbus-Key -> the bus uid of the newest keyed message sent to ``twin``."""
    return f"msgbus.router.latest.{twin}"


# hash: message id -> frame of an eventbus->rest delivery whose POST failed, waiting for its next attempt.
DELIVERIES = "msgbus.router.deliveries"
# zset: message id -> unix time (s) when that delivery is next due; leased while an attempt runs.
DELIVERY_SCHEDULE = "msgbus.router.deliveries.due"


# --- routing state (edge site) --------------------------------------------------------------------------

# string: JSON ``{"version", "cloud", "objects"}``: the rules this edge learnt from its cloud site, so that
# it keeps routing across restarts while the cloud is unreachable.
LEARNED = "msgbus.router.learned"


# string: JSON list of the MQTT filters the edge subscribed to for its rules, so that it can drop those
# of rules gone meanwhile (its broker keeps them across restarts).
SUBSCRIBED = "msgbus.router.subscribed"


def call_done(message_id: str) -> str:
    """string, TTL 1 day: a rest->servicebus call this edge started (``running``) or made (its answer), so
    that a message delivered again is never executed again."""
    return f"msgbus.router.calls.{message_id}"


CALL_DONE_TTL_S = 24 * 3600
# Seconds a pending record outlives its message, so that a late outcome is still counted.
PENDING_MARGIN_S = 300
