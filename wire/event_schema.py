"""The names and types of the event log and of the backlog snapshot: shared by msgbusd and the Spark job.

An event log (``msgbusd --event-log DIR``) is JSON lines, one object per step of a message's life. A
request is identified across sites by ``(src, uid)``: ``src`` and ``dst`` always name the request's source
and destination twins, also in the events about its reply, and ``uid`` is the per-destination id
``"<dst>.<n>"`` the source site gave it. ``site`` is the twin whose daemon wrote the line and ``host`` the
machine it runs on: two sites' timestamps are only compared when their ``host`` is the same (one clock).

docs/events.md documents every event and field; this module is what both sides import.
"""

from __future__ import annotations

from typing import Final

# --- events ----------------------------------------------------------------------------------------------
# On the source site (site == src):
ACCEPTED: Final = "accepted"  # a local client's request was taken and queued for dst
# For sent, send_failed, reply_sent and reply_failed, ts is when the POST started and duration_us its length.
SENT: Final = "sent"  # a POST carrying the request was answered 2xx (attempt, status, duration_us)
SEND_FAILED: Final = "send_failed"  # an attempt failed (attempt, status if any, duration_us, error)
RETRY_SCHEDULED: Final = "retry_scheduled"  # the next attempt is due after delay_ms (attempt)
REPLY_RECEIVED: Final = "reply_received"  # the reply came back from dst
DELIVERED: Final = "delivered"  # the reply was pushed to the caller's ret: the round trip is over
EXPIRED: Final = "expired"  # the request's lifetime ended without a reply; the caller got the timeout
FAILED: Final = "failed"  # all tries were spent; the caller got "all retries done" (error)
# On the destination site (site == dst):
RECEIVED: Final = "received"  # the request arrived from src
DUPLICATE: Final = "duplicate"  # a re-sent copy of a request already accepted; not queued again
HANDED_TO_SERVICE: Final = "handed_to_service"  # pushed to the service's list msgbus.<cmd> (queue)
REPLY_TAKEN: Final = "reply_taken"  # the service's reply was taken from msgbus.system.reply
REPLY_SENT: Final = "reply_sent"  # the reply was delivered to src (attempt, status, duration_us)
REPLY_FAILED: Final = "reply_failed"  # an attempt to send the reply failed (attempt, error)
# On any site:
REJECTED: Final = "rejected"  # the HTTP door refused a message (status, error; src if it could be read)

EVENTS: Final = (
    ACCEPTED,
    SENT,
    SEND_FAILED,
    RETRY_SCHEDULED,
    REPLY_RECEIVED,
    DELIVERED,
    EXPIRED,
    FAILED,
    RECEIVED,
    DUPLICATE,
    HANDED_TO_SERVICE,
    REPLY_TAKEN,
    REPLY_SENT,
    REPLY_FAILED,
    REJECTED,
)
# The events after which a request has its outcome at its source site.
OUTCOMES: Final = (DELIVERED, EXPIRED, FAILED)

# --- fields of an event line: name -> type ("long", "int", "string"), in the order they are written ---------
TS: Final = "ts"  # microseconds since the Unix epoch, UTC
SITE: Final = "site"
HOST: Final = "host"
EVENT: Final = "event"
UID: Final = "uid"
RET: Final = "ret"  # the caller's return queue (source site only)
CMD: Final = "cmd"
SRC: Final = "src"
DST: Final = "dst"
BYTES: Final = "bytes"  # size of the decoded payload
ATTEMPT: Final = "attempt"  # 1 for the first send of a request or reply
STATUS: Final = "status"  # HTTP status of a POST to a peer, or given by the door
DURATION_US: Final = "duration_us"  # how long that POST took
DELAY_MS: Final = "delay_ms"  # for retry_scheduled
QUEUE: Final = "queue"  # the Redis list a message was handed to
ERROR: Final = "error"

EVENT_FIELDS: Final[dict[str, str]] = {
    TS: "long",
    SITE: "int",
    HOST: "string",
    EVENT: "string",
    UID: "string",
    RET: "string",
    CMD: "string",
    SRC: "int",
    DST: "int",
    BYTES: "long",
    ATTEMPT: "int",
    STATUS: "int",
    DURATION_US: "long",
    DELAY_MS: "long",
    QUEUE: "string",
    ERROR: "string",
}

# --- the backlog snapshot (``msgbus backlog dump``): one JSON object per pending entry -------------------
# kind: "request" (waiting for its reply), "retry" (a re-send is scheduled), "reply" (a reply being
# forwarded), "queued" (an item waiting in a system queue or its processing list), "dead_letter".
KIND: Final = "kind"
TAKEN_AT: Final = "taken_at"  # when the snapshot was taken, microseconds since the epoch
AGE_S: Final = "age_s"  # how long the entry has been pending (from its request's `now`), when known
DEADLINE: Final = "deadline"  # when it expires, microseconds since the epoch, when known
DUE: Final = "due"  # for a retry or reply re-send: when it is due, microseconds since the epoch

BACKLOG_KINDS: Final = ("request", "retry", "reply", "queued", "dead_letter")
BACKLOG_FIELDS: Final[dict[str, str]] = {
    TAKEN_AT: "long",
    SITE: "int",
    KIND: "string",
    UID: "string",
    CMD: "string",
    SRC: "int",
    DST: "int",
    RET: "string",
    QUEUE: "string",
    AGE_S: "double",
    DEADLINE: "long",
    DUE: "long",
    ATTEMPT: "int",
    BYTES: "long",
    ERROR: "string",
}
