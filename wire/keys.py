"""Every Redis key the bus uses, with its type, writer and reader, and every TTL.

No other module spells a key literal. The first group is the RMB contract that outside programs see; the
second is msgbusd's internal bookkeeping, which only the daemon touches. The rules router's keys
(``msgbus.router.*``) are in :mod:`router.keys`.
"""

from __future__ import annotations

# --- RMB contract --------------------------------------------------------------------------------------

# list: local clients LPUSH/RPUSH request envelopes -> daemon pops from the left.
LOCAL = "msgbus.system.local"
# list: the daemon's /zbus-remote and /zbus-cmd -> daemon loop (requests to execute here).
REMOTE = "msgbus.system.remote"
# list: the daemon's /zbus-reply and local services -> daemon loop (replies to route).
REPLY = "msgbus.system.reply"
# hash: field "<dst>.<n>" -> the original local request (client ret, full dst, client uid, now = send time).
BACKLOG = "msgbus.system.backlog"
# Seconds a client's return list lives after each push (refreshed by every push).
RETURN_QUEUE_TTL_S = 1800

# The three system queues, in the priority go-rmb pops them with.
SYSTEM_QUEUES = (LOCAL, REMOTE, REPLY)


def command_queue(cmd: str) -> str:
    """list: the daemon LPUSHes requests for command ``cmd`` -> the local service pops (zos BRPOPs: FIFO)."""
    return f"msgbus.{cmd}"


def service_processing(queue: str, service: str) -> str:
    """list: requests a service named ``service`` took from the command list ``queue`` and has not answered
    yet; written and read by the client library's Service only (crash recovery)."""
    return f"{queue}.processing.{service}"


def uid_counter(dst: int) -> str:
    """string int: INCR once per message sent to twin ``dst``; the value makes the uid ``<dst>.<n>``."""
    return f"msgbus.counter.{dst}"


def taken_replies(ret: str) -> str:
    """list: replies the client library moved out of return list ``ret`` (BLMOVE) and has not handed to its
    caller yet; written and read by the client library only, so that a reply popped while Redis goes away is
    found again. Lives as long as ``ret`` (RETURN_QUEUE_TTL_S after each move)."""
    return f"{ret}.taken"


def is_system_queue(key: str) -> bool:
    """True for ``msgbus.system.*``: never given a TTL, never a client's return list."""
    return key.startswith("msgbus.system.")


# --- msgbusd internals ---------------------------------------------------------------------------------


def processing(queue: str) -> str:
    """list: items a consumer popped from ``queue`` and has not finished handing off (crash recovery): the
    rules router's, and a daemon's of a release that had one processing list per queue (taken back at
    start)."""
    return f"{queue}.processing"


def instance_processing(queue: str, instance: str) -> str:
    """list: items daemon instance ``instance`` popped from the system queue ``queue`` and has not finished
    handing off. Moved back to the head of ``queue`` when the instance starts again, or by a live instance
    once it is dead (see INSTANCES)."""
    return f"{queue}.processing.{instance}"


def processing_lists(queue: str, instances: list[str]) -> list[str]:
    """Every processing list of the system queue ``queue``: the one of an older release, and each
    instance's."""
    return [processing(queue), *(instance_processing(queue, instance) for instance in instances)]


# zset: daemon instance id -> unix time (s, Redis's clock) of its last heartbeat. The daemons sharing a Redis
# are one site; one whose heartbeat is older than its lease (--instance-lease) is dead, and a live one takes
# over its processing lists and its leases, then removes it.
INSTANCES = "msgbus.system.instances"


def instance_info(instance: str) -> str:
    """hash: what instance ``instance`` says of itself at each heartbeat: ``process`` (JSON: host, boot id,
    pid, start time, so that a dead process on the same host is known at once), ``listen``, ``started``,
    ``owned`` (leases held), ``sent`` and ``accepted`` (messages so far). Expires when the heartbeats stop."""
    return f"msgbus.system.instance.{instance}"


# hash: lease name -> the instance holding it. A lease is the right to do one site-wide job alone: send to a
# destination (its twin id as the name: one sender per send queue, so order and batching hold), take from
# msgbus.system.local (LOCAL_LEASE: one taker keeps push order), take the services' replies from
# msgbus.system.reply (REPLY_LEASE: one taker takes them in large batches; the others help only while
# replies pile up) or run the retry and expiry timers (TIMERS_LEASE). A lease held by an instance that is
# not live is free.
OWNERS = "msgbus.system.owners"
# hash: twin id -> the instance of this site its uplink (msgbusd --uplink at that twin's site) is open to.
# That instance holds the lease of sending to the twin while it is live, whatever rendezvous hashing says: the
# twin is reached over that link only.
UPLINKS = "msgbus.system.uplinks"
# string int: INCR with every change of UPLINKS, so that an instance reads that hash (one field per edge on a
# cloud site) again only when it changed.
UPLINKS_VERSION = "msgbus.system.uplinks.version"
# list of strings "<version>|<instance>|<twins opened, comma-separated>|<twins closed>": the last changes of
# UPLINKS, one per version, so that an instance reads what changed since its last read, not the whole hash.
UPLINK_CHANGES = "msgbus.system.uplinks.changes"
LOCAL_LEASE = "local"
REPLY_LEASE = "reply"
TIMERS_LEASE = "timers"


def wake_channel(instance: str) -> str:
    """pub/sub channel: the names of leases given to ``instance``, or of destinations it holds that have
    something new to send (published by other instances; each instance also looks for work it holds every
    few seconds, so a lost message only delays)."""
    return f"msgbus.system.wake.{instance}"


# zset: member "req:<uid>" (a request's re-send) or "rep:<key>" (a reply's) -> unix time (float s) when it is
# due, after a failure of that message (a refusal, not its peer being down). When due, the retry timer moves
# it to its destination's send queue, in one script.
OUTBOX = "msgbus.system.outbox"
# set: destination twins whose send queue is not empty; read at start-up to resume sending.
DESTINATIONS = "msgbus.system.destinations"
# hash: uid -> failed delivery attempts of that request so far.
ATTEMPTS = "msgbus.system.attempts"
# zset: uid -> unix time (s) after which the request expires (send time + exp).
DEADLINES = "msgbus.system.deadlines"
# hash: "<dst>|<uid>" -> a reply envelope waiting to be forwarded to twin dst.
REPLIES = "msgbus.system.replies"
# hash: "<dst>|<uid>" -> JSON {"first": unix s, "attempts": n, "deadline": unix s} of a reply being forwarded.
REPLY_STATE = "msgbus.system.replies.state"
# string int: written before each WAIT of --redis-wait-replicas (see msgbusd.store.replication).
REPLICATED = "msgbus.system.replicated"
# string: the twin of the daemon serving this Redis, written at its start (for snapshots of the backlog).
SITE_TWIN = "msgbus.system.twin"

# list: JSON {"queue", "reason", "raw", "at"} of items that could not be decoded or routed; for operators.
DEAD_LETTER = "msgbus.system.deadletter"
# How many dead letters are kept (oldest trimmed).
DEAD_LETTER_MAX = 10_000


# What every send queue's name starts with (the retry timer's script appends the destination).
SEND_QUEUE_PREFIX = "msgbus.system.send."


def send_queue(dst: int) -> str:
    """list: requests (``req:<uid>``) and replies (``rep:<key>``) to send to twin ``dst``, in order: first
    sends as they were accepted, and re-sends whose time came (moved here from the outbox).

    The daemon's sender for ``dst`` reads the first entries, sends them, then pops them: a crash in between
    re-sends them, which the receiver's de-duplication absorbs.
    """
    return f"{SEND_QUEUE_PREFIX}{dst}"


def give_up(dst: int) -> str:
    """zset: send-queue entries (``req:<uid>``, ``rep:<key>``) waiting for twin ``dst`` while it is down ->
    unix time (s) when each gives up if it is still down then: a request when its remaining tries, spaced by
    its backoff, would have run out (not with --hold-offline), a reply at its request's deadline. Written and
    read by ``dst``'s sender while ``dst`` is down; deleted when ``dst`` answers again.
    """
    return f"msgbus.system.giveup.{dst}"


def seen(src: int, seen_id: str) -> str:
    """string, with a TTL of the request's lifetime: the receiver already queued this request from ``src``.

    ``seen_id`` is the uid plus a digest of the command and payload, so that a sender whose counters were
    reset (a Redis without persistence) cannot have new requests mistaken for old ones.
    """
    return f"msgbus.system.seen.{src}.{seen_id}"


REQUEST_PREFIX = "req:"
REPLY_PREFIX = "rep:"


def reply_key(dst: int, uid: str) -> str:
    return f"{dst}|{uid}"


RELAYED_MARK = "relay:"


def relayed_key(dst: int, src: int, is_request: bool, uid: str) -> str:
    """The key under which a relay keeps a message from ``src`` for ``dst`` (a twin it relays) until it is
    sent on: a reply key (its send-queue entry is ``rep:<key>``) that says what the message is."""
    return f"{dst}|{RELAYED_MARK}{src}:{'req' if is_request else 'rep'}:{uid}"


def relayed_is_request(key: str) -> bool | None:
    """Whether the message kept under reply key ``key`` is a request (True) or a reply (False), for a message
    a relay keeps; None for a service's reply of this site."""
    _dst, _bar, rest = key.partition("|")
    if not rest.startswith(RELAYED_MARK):
        return None
    return rest.removeprefix(RELAYED_MARK).split(":", 2)[1:2] == ["req"]
