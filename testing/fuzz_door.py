"""Fuzzing a real site's HTTP door: hypothesis-generated requests against msgbusd, then an audit of its Redis.

A two-site :class:`LocalCluster` runs (real redis-server and msgbusd processes); site 1 is the target. The
twin map also names three twins whose keys we hold and whose addresses answer nothing: site 1's open
requests go to twins 20 and 22, so replies to them can be forged or signed for real. Every request is
recorded; after the run every Redis list of site 1 must hold only what a correctly signed message produced.

    .venv/bin/python -m testing.fuzz_door --examples 20000
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import signal
import socket
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from msgbusd.door.http_api import seen_id
from msgbusd.identity.keys import load_signer, new_mnemonic
from msgbusd.identity.signing import SignatureError, Signer, verify
from msgbusd.sending.send_items import destination_of
from testing.local_sites import LocalCluster, free_port, wait_until
from twin_resolver.base import Twin
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError
from wire.redis_url import as_text

SITE, PEER, ASKED, ROGUE, ED_TWIN, UNKNOWN = 1, 2, 20, 21, 22, 999
SIGNED_PATHS = ("/zbus-remote", "/zbus-reply", "/zbus-cmd")
ENDPOINTS = (*SIGNED_PATHS, "/zbus-result", "/zbus-batch")
OTHER_PATHS = ("/healthz", "/metrics", "/", "/zbus-remote/x", "/nope")
METHODS = ("POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "FUZZ")
# The contract's 5xx are 502 (the twin source cannot answer) and 503 (the site's Redis failed); neither fails
# here (a static twin map, a healthy Redis), so any 5xx is a bug. Every 4xx is allowed, 413 (body over the
# size limit) and 429 (twin over its rate) included.
# Commands whose queue msgbus.<cmd> is one of the daemon's own keys (see the known-bug tests).
RESERVED_CMD_PREFIXES = ("system.", "counter.")
GARBAGE_KINDS = ("bytes", "json", "truncated-json", "replay") * 2 + ("empty",)
# Bodies of two known bugs (tests/door/test_fuzz_door.py), sent only when asked for, as are their other
# inputs: commands naming the daemon's queues or holding a lone surrogate, pxy on any envelope, lifetimes past
# 1e15 s.
BUG_GARBAGE_KINDS = ("deep-json", "far-now")


@dataclass(frozen=True)
class DoorRequest:
    method: str
    path: str
    body: bytes
    kind: str
    # Declare more bytes than sent, then close: a body cut off in transit.
    truncated: bool = False


@dataclass
class Figures:
    """What a run saw: inputs and statuses per endpoint, 5xx, and what reached site 1's lists."""

    inputs: Counter[str] = field(default_factory=Counter)
    statuses: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    kinds: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    server_error_kinds: Counter[str] = field(default_factory=Counter)
    # Complete requests whose connection the site closed or reset instead of answering.
    resets: list[str] = field(default_factory=list)
    unauthenticated_accepted: list[str] = field(default_factory=list)
    # Replies in a return queue that no open request of the site was waiting for.
    forged_replies: list[str] = field(default_factory=list)
    authentic_sent: int = 0
    queued: Counter[str] = field(default_factory=Counter)
    unexplained: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    crashed: bool = False
    healthy_at_end: bool = False
    elapsed_s: float = 0.0

    def report(self) -> str:
        lines = [f"inputs: {sum(self.inputs.values())} in {self.elapsed_s:.0f} s"]
        for path in sorted(self.inputs):
            seen = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses[path].items()))
            lines.append(f"  {path}: {self.inputs[path]} inputs; statuses {seen}")
        lines.append("input kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items())))
        lines.append(f"crashes: {int(self.crashed)}; healthy at the end: {self.healthy_at_end}")
        lines.append(f"5xx: {len(self.server_errors)} by input kind {dict(self.server_error_kinds)}")
        lines.append(
            f"complete requests not answered (connection reset): {len(self.resets)} {self.resets[:2]}"
        )
        lines.append(f"unauthenticated messages answered 200: {len(self.unauthenticated_accepted)}")
        lines.extend(f"    {accepted}" for accepted in self.unauthenticated_accepted[:3])
        lines.append(f"correctly signed envelopes sent: {self.authentic_sent}")
        lines.append(
            "items in site 1's lists: " + ", ".join(f"{k} {n}" for k, n in sorted(self.queued.items()))
        )
        lines.append(
            f"unauthenticated messages that reached a queue: {len(self.unexplained)} {self.unexplained[:5]}"
        )
        lines.append(f"forged replies that reached a return queue: {len(self.forged_replies)}")
        lines.extend(f"    {forged}" for forged in self.forged_replies[:3])
        lines.append(f"requests queued twice for a service: {len(self.duplicates)}")
        return "\n".join(lines)


@dataclass
class Provenance:
    """Every correctly signed envelope sent, in the forms the site may store it in (as digests)."""

    # Without ``sig`` and ``ret``, and with ``pxy`` as sent or set: the site re-routes a reply to its caller's
    # queue, sets ``pxy`` and ``ret`` on a /zbus-cmd request, drops ``sig`` from a reply it forwards.
    forms: set[bytes] = field(default_factory=set)
    # (uid, cmd, src) of requests the site may answer with an error of its own.
    answered: set[tuple[str, str, int]] = field(default_factory=set)

    def add(self, env: Envelope) -> None:
        self.forms.add(_digest(env.replace(sig="", ret="")))
        self.forms.add(_digest(env.replace(sig="", ret="", pxy=True)))
        self.answered.add((env.uid, env.cmd, env.src))

    def explains(self, env: Envelope) -> bool:
        if _digest(env.replace(sig="", ret="")) in self.forms:
            return True
        # The site's own "received invalid message" answer to a signed request (src/dst swapped, no dat).
        return (
            bool(env.err)
            and env.src == SITE
            and len(env.dst) == 1
            and ((env.uid, env.cmd, env.dst[0]) in self.answered)
        )


def _digest(env: Envelope) -> bytes:
    # Not env.encode(): that cannot write a lone surrogate (a known bug), which a signed envelope may carry.
    return hashlib.sha256(json.dumps(env.to_wire()).encode()).digest()


class FuzzTarget:
    """Site 1 of a running two-site cluster, with its open requests, and the keys of the twins we play."""

    def __init__(self, cluster: LocalCluster, signers: dict[int, Signer]) -> None:
        self.cluster = cluster
        self.signers = signers
        self.url = cluster.sites[0].url
        self.redis = redis.Redis.from_url(cluster.redis[0].url)
        self.caller_queues = [str(uuid.uuid4()) for _ in range(4)]
        self.open_uids: list[str] = []
        self.provenance = Provenance()
        self.replay_pool: list[bytes] = []
        self.known_bugs = False

    def open_requests(self, count: int = 8) -> None:
        """Have site 1 send requests to twins 20 and 22 that stay open (their addresses answer nothing)."""
        for index in range(count):
            dst = ASKED if index % 2 == 0 else ED_TWIN
            env = Envelope(cmd="fuzz.asked", dst=(dst,), ret=self.caller_queues[index % 4], exp=3600)
            self.redis.rpush(keys.LOCAL, env.replace(retries=1000, dat="b3Blbg==").encode())
        wait_until(lambda: self.redis.hlen(keys.BACKLOG) >= count, what="site 1 to accept its requests")
        self.open_uids = sorted(uid.decode() for uid in cast(list[bytes], self.redis.hkeys(keys.BACKLOG)))

    def alive(self) -> bool:
        process = self.cluster.sites[0].process
        return process is not None and process.poll() is None

    def healthy(self) -> bool:
        try:
            answer = httpx.get(self.url + "/healthz", timeout=10)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and answer.json().get("status") == "ok"


@contextmanager
def fuzz_target(key_type: str = "sr25519") -> Iterator[FuzzTarget]:
    """Start the cluster (with slow retries, so open requests stay quiet) and yield site 1 as a target."""
    signers = {
        ASKED: load_signer(new_mnemonic(), "sr25519"),
        ROGUE: load_signer(new_mnemonic(), "sr25519"),
        ED_TWIN: load_signer(new_mnemonic(), "ed25519"),
    }
    closed = f"127.0.0.1:{free_port()}"
    extra = [Twin(twin, closed, signer.public_key) for twin, signer in signers.items()]
    slow_retries = ["--retry-delay", "30", "--retry-max-delay", "60", "--log-level", "info"]
    cluster = LocalCluster(size=2, key_type=key_type, extra_args=slow_retries, extra_twins=extra).start()
    try:
        for site in cluster.sites:
            signers[site.twin] = load_signer(site.mnemonic, key_type)
        target = FuzzTarget(cluster, signers)
        target.open_requests()
        yield target
        target.redis.close()
    finally:
        cluster.cleanup()


# --- what to send -----------------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=24)
wire_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
commands = st.one_of(
    st.sampled_from(["fuzz.echo", "fuzz.asked", "", "a" * 300, "zos.statistics.get"]),
    texts.filter(lambda cmd: not cmd.startswith(RESERVED_CMD_PREFIXES)),
)
# Beyond about 9.2e15 s, the de-duplication key's expiry is out of Redis's range (a known bug).
lifetimes = st.integers(min_value=-(2**63), max_value=10**15)
bug_commands = st.sampled_from(["system.local", "system.reply", "fuzz.\ud800"])


@st.composite
def timestamps(draw: st.DrawFn) -> int:
    """Fresh, stale, future or extreme; drawn as offsets, so that the draws do not depend on the clock."""
    offset = draw(
        st.one_of(
            st.integers(-50, 0),
            st.integers(-50, 0),
            st.integers(-50, 0),
            st.integers(-(10**9), -62),
            st.integers(1, 10**9),
            st.none(),
        )
    )
    if offset is None:
        return int(draw(st.sampled_from([0, -1, -(2**63), 2**63 - 1])))
    return int(time.time()) + int(offset)


@st.composite
def envelopes(draw: st.DrawFn, target: FuzzTarget, path: str) -> Envelope:
    """An envelope that may be a fresh request, a reply to one of site 1's open requests, or nonsense."""
    uid = draw(
        st.one_of(
            st.just(""),
            st.sampled_from(target.open_uids),
            st.builds(
                lambda d, n: f"{d}.{n}", st.sampled_from([SITE, ASKED, ED_TWIN]), st.integers(0, 10**6)
            ),
            texts,
        )
    )
    src = draw(st.sampled_from([PEER, ASKED, ED_TWIN, ROGUE, PEER, ASKED, SITE, UNKNOWN, 0, -5, 2**63 - 1]))
    # A peer's message with pxy set makes the site push to whatever list its ret names (a known bug): only
    # /zbus-cmd bodies carry it, unless bugs are asked for.
    pxy = st.booleans() if target.known_bugs else st.just(path == "/zbus-cmd")
    cmds = st.one_of(commands, commands, commands, bug_commands) if target.known_bugs else commands
    return Envelope(
        ver=draw(st.sampled_from([1, 1, 1, 0, 2, -1])),
        uid=uid,
        cmd=draw(cmds),
        exp=draw(st.sampled_from([0, 60, 3600]) | (wire_ints if target.known_bugs else lifetimes)),
        retries=draw(st.integers(0, 3) | wire_ints),
        dat=draw(st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()) | texts),
        src=src,
        dst=tuple(
            draw(st.just([SITE]) | st.lists(st.sampled_from([SITE, PEER, ASKED, UNKNOWN]), max_size=3))
        ),
        ret=draw(st.sampled_from([keys.REPLY, "", str(uuid.uuid4()), *target.caller_queues]) | texts),
        shm=draw(texts),
        now=draw(timestamps()),
        pxy=draw(pxy | st.just(path == "/zbus-cmd")),
        err=draw(st.just("") | texts),
    )


@st.composite
def signed(draw: st.DrawFn, target: FuzzTarget, path: str) -> tuple[Envelope, str]:
    """An envelope and its ``sig``: right, by another key, tampered with after signing, short, or junk."""
    env = draw(envelopes(target, path))
    own = target.signers.get(env.src, target.signers[ROGUE])
    mode = draw(
        st.sampled_from(
            ["right", "right", "right", "upper", "foreign", "tampered", "empty", "short", "junk", "prefix"]
        )
    )
    if mode in ("right", "upper"):
        sig = own.sign(env).sig
        return env.replace(sig=sig.upper() if mode == "upper" else sig), mode
    if mode == "foreign":
        other = draw(st.sampled_from(sorted(target.signers)))
        return target.signers[other].sign(env), mode
    if mode == "tampered":
        sig = own.sign(env).sig
        change = draw(st.sampled_from(["uid", "cmd", "dat", "ret", "now", "src", "dst"]))
        value: Any = {"now": env.now - 1, "src": env.src + 1, "dst": (*env.dst, SITE)}.get(change)
        return env.replace(
            **{change: value if value is not None else getattr(env, change) + "x"}, sig=sig
        ), mode
    raw = bytes.fromhex(own.sign(env).sig)
    if mode == "short":
        return env.replace(sig=raw[: draw(st.integers(0, 64))].hex()), mode
    if mode == "prefix":
        return env.replace(sig=(bytes([draw(st.integers(0, 255))]) + raw[1:]).hex()), mode
    junk = st.text(max_size=140) | st.binary(max_size=80).map(bytes.hex)
    return env.replace(sig=draw(junk) if mode == "junk" else ""), mode


def _wire_object(draw: st.DrawFn, env: Envelope) -> dict[str, Any]:
    """The envelope's wire object, with keys in random case, sometimes one dropped, one retyped or extras."""
    obj = {key.upper() if draw(st.booleans()) else key: v for key, v in env.to_wire().items()}
    twist = draw(st.sampled_from(["none", "none", "none", "drop", "retype", "extra"]))
    key = draw(st.sampled_from(sorted(obj)))
    if twist == "drop":
        del obj[key]
    elif twist == "retype":
        obj[key] = draw(json_values)
    elif twist == "extra":
        obj[draw(st.text(max_size=6))] = draw(json_values)
    return obj


@st.composite
def envelope_bodies(draw: st.DrawFn, target: FuzzTarget, path: str) -> tuple[bytes, str]:
    env, mode = draw(signed(target, path))
    return json.dumps(_wire_object(draw, env)).encode(), f"sig-{mode}"


@st.composite
def batch_bodies(draw: st.DrawFn, target: FuzzTarget) -> tuple[bytes, str]:
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        item_path = draw(st.sampled_from(["/zbus-remote", "/zbus-reply", "/zbus-cmd", ""]))
        env, _mode = draw(signed(target, item_path or "/zbus-remote"))
        item = {"path": item_path, "envelope": _wire_object(draw, env)}
        items.append(draw(st.just(item) | json_values))
    body = draw(st.just({"messages": items}) | st.builds(lambda v: {"messages": v}, json_values))
    return json.dumps(body).encode(), "batch"


@st.composite
def result_bodies(draw: st.DrawFn, target: FuzzTarget) -> tuple[bytes, str]:
    retqueue = draw(
        st.sampled_from(target.caller_queues)
        | st.builds(lambda: str(uuid.uuid4()))
        | st.just(str(uuid.uuid1()))
        | json_values
    )
    return json.dumps({"retqueue": retqueue}).encode(), "result"


@st.composite
def garbage_bodies(draw: st.DrawFn, target: FuzzTarget, huge_bytes: int) -> tuple[bytes, str]:
    bugs = BUG_GARBAGE_KINDS if target.known_bugs else ()
    kind = draw(st.sampled_from([*GARBAGE_KINDS, *GARBAGE_KINDS, "huge", *bugs]))
    if kind == "deep-json":
        return b"[" * 100_000, kind
    if kind == "far-now":
        return json.dumps({"src": PEER, "now": -(10**300)}).encode(), kind
    if kind == "bytes":
        return draw(st.binary(max_size=200)), kind
    if kind == "json":
        return json.dumps(draw(json_values)).encode(), kind
    if kind == "truncated-json":
        env, _ = draw(signed(target, "/zbus-remote"))
        raw = json.dumps(env.to_wire()).encode()
        return raw[: draw(st.integers(0, len(raw) - 1))], kind
    if kind == "replay":
        pick = draw(st.integers(0, 10**6))
        pool = target.replay_pool
        return (pool[pick % len(pool)] if pool else b""), kind
    if kind == "huge":
        # A few sizes and one uid: the site queues each size once, not one copy per input.
        size = draw(st.sampled_from([huge_bytes // 4, huge_bytes // 2, huge_bytes - 256, huge_bytes + 1]))
        env = Envelope(cmd="fuzz.huge", src=PEER, dst=(SITE,), ret=keys.REPLY, now=int(time.time()),
                       uid=f"{SITE}.0", dat=base64.b64encode(b"x" * (size * 3 // 4)).decode())  # fmt: skip
        return draw(
            st.just(target.signers[PEER].sign(env).encode()) | st.just(b'{"dat": "' + b"A" * size)
        ), kind
    return b"", "empty"


@st.composite
def door_requests(draw: st.DrawFn, target: FuzzTarget, huge_bytes: int) -> DoorRequest:
    path = draw(st.sampled_from([*ENDPOINTS, *ENDPOINTS]) | st.sampled_from(OTHER_PATHS))
    method = draw(st.sampled_from(METHODS))
    if path in SIGNED_PATHS:
        content = envelope_bodies(target, path)
    elif path == "/zbus-batch":
        content = batch_bodies(target)
    elif path == "/zbus-result":
        content = result_bodies(target)
    else:
        content = garbage_bodies(target, huge_bytes)
    body, kind = draw(st.one_of(content, content, content, garbage_bodies(target, huge_bytes)))
    return DoorRequest(method, path, body, kind, truncated=draw(st.sampled_from([False] * 24 + [True])))


# --- sending and judging ------------------------------------------------------------------------------------


def _authentic(target: FuzzTarget, obj: Any) -> Envelope | None:
    """The envelope in ``obj`` if it decodes and its signature verifies with its source twin's key."""
    try:
        env = Envelope.from_wire(obj)
        signer = target.signers.get(env.src)
        if signer is None:
            return None
        verify(env, signer.public_key)
    except (EnvelopeDecodeError, SignatureError):
        return None
    return env


def _authentic_items(target: FuzzTarget, request: DoorRequest) -> list[Envelope | None]:
    """One entry per envelope the body carries (one, or a batch's items): the authentic ones, else None."""
    try:
        obj = json.loads(request.body)
    except (ValueError, RecursionError):
        return [None]
    if request.path == "/zbus-batch":
        messages = obj.get("messages") if isinstance(obj, dict) else None
        items = messages if isinstance(messages, list) else []
        return [_authentic(target, m.get("envelope")) if isinstance(m, dict) else None for m in items]
    return [_authentic(target, obj)]


def send_truncated(target: FuzzTarget, request: DoorRequest) -> str:
    """Declare one more byte than sent, stop writing, and report how the site answered."""
    port = target.cluster.sites[0].port
    declared = len(request.body) + 1
    head = f"{request.method} {request.path} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head.encode() + request.body)
            sock.shutdown(socket.SHUT_WR)
            answer = sock.recv(64)
    except OSError:
        return "reset"
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"


def send(target: FuzzTarget, client: httpx.Client, request: DoorRequest, figures: Figures) -> None:
    """Send one request, record its answer, and note any answer the contract does not allow."""
    authentic = _authentic_items(target, request)
    for env in authentic:
        if env is not None:
            target.provenance.add(env)
            figures.authentic_sent += 1
    if any(authentic) and request.path in ("/zbus-remote", "/zbus-batch") and len(request.body) < 65536:
        target.replay_pool.append(request.body)
    figures.inputs[request.path] += 1
    figures.kinds[request.kind + ("-cut" if request.truncated else "")] += 1
    if request.truncated:
        status_text = send_truncated(target, request)
        figures.statuses[request.path][status_text] += 1
        if status_text.startswith("5"):
            figures.server_errors.append(f"{request.method} {request.path} cut off -> {status_text}")
        return
    try:
        answer = client.request(request.method, request.path, content=request.body)
    except httpx.TransportError as exc:
        figures.statuses[request.path]["reset"] += 1
        figures.resets.append(f"{request.method} {request.path} {request.body[:120]!r}: {exc!r}")
        return
    status = answer.status_code
    figures.statuses[request.path][str(status)] += 1
    where = f"{request.method} {request.path} {request.body[:120]!r} -> {status} {answer.text[:200]}"
    if status >= 500:
        figures.server_errors.append(where)
        figures.server_error_kinds[request.kind] += 1
    if status != 200 or request.method == "HEAD":
        return
    if request.path in SIGNED_PATHS and authentic[0] is None:
        figures.unauthenticated_accepted.append(where)
    if request.path == "/zbus-batch":
        results = answer.json()["results"]
        for env, result in zip(authentic, results, strict=False):
            if result.get("status") == 200 and env is None:
                figures.unauthenticated_accepted.append(f"batch item of {where}")


def fuzz(target: FuzzTarget, examples: int, huge_bytes: int = 1 << 20) -> Figures:
    """Send ``examples`` generated requests to site 1, then audit its Redis; return the figures."""
    figures = Figures()
    started = time.monotonic()
    with httpx.Client(base_url=target.url, timeout=60) as client:

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(door_requests(target, huge_bytes))
        def run(request: DoorRequest) -> None:
            send(target, client, request, figures)

        run()
    figures.crashed = not target.alive()
    figures.healthy_at_end = target.healthy()
    audit(target, figures)
    figures.elapsed_s = time.monotonic() - started
    return figures


# --- the audit ----------------------------------------------------------------------------------------------


def settled(conn: redis.Redis) -> bool:
    """No system queue holds work still to be routed."""
    instances = [as_text(n) for n in conn.zrange(keys.INSTANCES, 0, -1)]
    queues = [
        *keys.SYSTEM_QUEUES,
        *(p for q in keys.SYSTEM_QUEUES for p in keys.processing_lists(q, instances)),
    ]
    return all(conn.llen(queue) == 0 for queue in queues)


def audit(target: FuzzTarget, figures: Figures) -> None:
    """Check every item of every list in site 1's Redis against what was correctly signed."""
    conn = target.redis
    wait_until(lambda: settled(conn), timeout_s=30, what="site 1 to route what it took")
    service_copies: Counter[tuple[int, str]] = Counter()
    for raw_key in conn.scan_iter(count=1000):
        key = raw_key.decode()
        if conn.type(raw_key) != b"list":
            continue
        for item in cast(list[bytes], conn.lrange(raw_key, 0, -1)):
            category, env = _item_envelope(conn, key, item)
            figures.queued[category] += 1
            if category == "send-request" and item.decode().removeprefix("req:") in target.open_uids:
                continue
            if category == "send-finished":
                continue
            if env is None or not target.provenance.explains(env):
                figures.unexplained.append(f"{key}: {item[:200]!r}")
            elif category == "return-queue" and not _awaited(target, key, env):
                figures.forged_replies.append(f"{key}: {item[:200]!r}")
            elif category == "service" and env.uid and not env.pxy:
                service_copies[(env.src, seen_id(env))] += 1
    figures.duplicates = [f"{src} {sid}" for (src, sid), n in service_copies.items() if n > 1]


def _awaited(target: FuzzTarget, queue: str, env: Envelope) -> bool:
    """Whether a return queue item answers what its caller waits for: one of site 1's open requests, from
    the twin it was sent to, or, for a /zbus-cmd request (pxy), the site's own error."""
    if queue in target.caller_queues:
        return env.uid in target.open_uids and destination_of(env.uid) == env.src
    return env.pxy and env.src == SITE and bool(env.err)


def _item_envelope(conn: redis.Redis, key: str, item: bytes) -> tuple[str, Envelope | None]:
    """What a list item holds, and which kind of list it is in."""
    if key.startswith("msgbus.system.send."):
        if item.startswith(b"req:"):
            return "send-request", None
        stored = cast(bytes | None, conn.hget(keys.REPLIES, item.decode().removeprefix("rep:")))
        if stored is None:
            # A reply given up (or sent) whose entry waits behind live ones to be popped: it carries nothing.
            return "send-finished", None
        return "send-reply", _decoded(stored)
    if key == keys.DEAD_LETTER:
        return "dead-letter", _decoded(json.loads(item)["raw"].encode())
    if key.startswith("msgbus.system."):
        return "system", _decoded(item)
    if key.startswith("msgbus."):
        return "service", _decoded(item)
    return "return-queue", _decoded(item)


def _decoded(raw: bytes) -> Envelope | None:
    try:
        return Envelope.decode(raw)
    except EnvelopeDecodeError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="requests to generate")
    parser.add_argument("--huge-mib", type=float, default=13, help="the largest body sent, in MiB")
    parser.add_argument("--key-type", default="sr25519", choices=["sr25519", "ed25519"])
    parser.add_argument("--known-bugs", action="store_true", help="also send the inputs of known bugs")
    args = parser.parse_args(argv)
    # Stop cleanly (the cluster's processes with us) on SIGTERM too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with fuzz_target(args.key_type) as target:
        target.known_bugs = args.known_bugs
        figures = fuzz(target, args.examples, int(args.huge_mib * (1 << 20)))
    print(figures.report())
    bad = figures.crashed or figures.server_errors or figures.resets or figures.unexplained
    bad = bad or figures.unauthenticated_accepted or figures.forged_replies or figures.duplicates
    return 1 if bad or not figures.healthy_at_end else 0


if __name__ == "__main__":
    sys.exit(main())
