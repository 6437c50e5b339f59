"""A thin link: two sites on two hosts of the network test bed, the callee's link shaped to ``--kbit`` each
way (2 Mbit/s by default), msgbus's pair and go-rmb's pair (``--peer-bin``) on the same hosts, one after the
other in the same run.

For each system: a few small requests to open what it keeps open; then a big request (``--big-mib``, 8 MiB
by default; its reply is small: the size and digest of what the service got) alone, timed from push to
reply; then the same big request again while the caller's site sends a small request (``--small-bytes``)
every ``--small-every-ms`` to an echo service beside it, from a little before the big one is pushed until
its reply is back. Reported: the small requests' latency while the big one was on its way (p50, p99, max),
the big one's time against its time alone, and every request that got no reply, a second reply, a reply
with another payload, an error, or was executed twice by the service.

    python -m bench.thin_link [--kbit 2000] [--big-mib 8] [--peer-bin GO_RMB] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import re
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.bed_sites import CALLEE_TWIN, Pair, go_rmb_pair, keep_logs, msgbus_pair, service, two_hosts
from testing.netbed import require_netbed
from wire import keys
from wire.envelope import Envelope, encode_payload

SMALL = "bench.echo"
BIG = "bench.big"
WARM_UP_REQUESTS = 5
# The small requests flow this long before the big one is pushed.
LEAD_S = 1.0
# After the big one's reply, the small ones still on their way get this long.
SETTLE_S = 30.0
# Between the big request alone and the big one with the small ones: what is in the queues drains.
PAUSE_S = 2.0
POP_SLICE_S = 0.2
SMALL_EXP_S = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TROUBLE = re.compile(r'"level": "(WARNING|ERROR|CRITICAL)"|^\S+ (warn|error|fatal|panic) ')


@dataclass(frozen=True)
class Settings:
    kbit: int = 2000
    big_bytes: int = 8 * 1024 * 1024
    small_bytes: int = 64
    small_every_s: float = 0.15
    # How long the big request may take at most (0: three times its time at the link's rate, plus a minute).
    big_limit_s: float = 0.0
    key_type: str = "ed25519"
    peer_bin: str | None = None
    logs_dir: Path | None = None

    def big_limit(self) -> float:
        if self.big_limit_s > 0:
            return self.big_limit_s
        # base64 in JSON: 4/3 of the payload crosses the link.
        return 3 * self.big_bytes * 4 / 3 * 8 / (self.kbit * 1000) + 60


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def small_payload(number: int, size: int) -> bytes:
    return b"%d:" % number + b"x" * size


def big_answer(number: int, payload: bytes) -> bytes:
    """The service's reply to a big request: its number, the size and the digest of what it got."""
    return f"{number}:{len(payload)}:{_digest(payload)}".encode()


@dataclass
class Reply:
    at: float
    err: str
    intact: bool


class Calls:
    """Requests to ``cmd`` at twin 2 from the caller's site, numbered from 0 (the number opens the payload),
    their replies on one return queue, collected with the time each came."""

    def __init__(self, redis_url: str, cmd: str) -> None:
        self.redis_url = redis_url
        self.cmd = cmd
        self.ret = f"bench.thin.{cmd}.{uuid.uuid4().hex[:8]}"
        self.pushed_at: dict[int, float] = {}
        self.expected: dict[int, bytes] = {}
        self.replies: dict[int, list[Reply]] = {}
        self.foreign = 0

    def envelope(self, number: int, payload: bytes, exp_s: int) -> bytes:
        self.expected[number] = big_answer(number, payload) if self.cmd == BIG else payload
        return Envelope(
            uid=str(number),
            cmd=self.cmd,
            exp=exp_s,
            dat=encode_payload(payload),
            dst=(CALLEE_TWIN,),
            ret=self.ret,
            now=int(time.time()),
        ).encode()

    async def push(self, conn: aioredis.Redis, number: int, raw: bytes) -> None:
        self.pushed_at[number] = time.perf_counter()
        await conn.rpush(keys.LOCAL, raw)

    async def collect(self, stop: asyncio.Event) -> None:
        conn = aioredis.Redis.from_url(self.redis_url)
        try:
            while not stop.is_set():
                item = await conn.blpop([self.ret], timeout=POP_SLICE_S)
                if item is None:
                    continue
                at = time.perf_counter()
                reply = Envelope.decode(item[1])
                head = reply.payload.partition(b":")[0] if not reply.err else reply.uid.encode()
                if not head.isdigit() or int(head) not in self.expected:
                    self.foreign += 1
                    continue
                number = int(head)
                intact = bool(reply.err) or reply.payload == self.expected[number]
                self.replies.setdefault(number, []).append(Reply(at, reply.err, intact))
        finally:
            await conn.aclose()

    def took_s(self, number: int) -> float | None:
        found = self.replies.get(number)
        return found[0].at - self.pushed_at[number] if found else None

    def replied(self, number: int) -> Callable[[], bool]:
        """Whether request ``number`` has a reply, as a condition to wait for."""
        return lambda: number in self.replies

    def answered(self) -> int:
        return len(self.replies)

    def audit(self) -> dict[str, Any]:
        """Requests with no reply, a second reply, a reply that is not theirs, an error (the first one)."""
        errors = [found[0].err for found in self.replies.values() if found[0].err]
        return {
            "pushed": len(self.pushed_at),
            "lost": sum(1 for number in self.pushed_at if number not in self.replies),
            "doubled": sum(len(found) - 1 for found in self.replies.values()),
            "damaged": sum(1 for found in self.replies.values() for reply in found if not reply.intact),
            "errors": len(errors),
            "first_error": errors[0][:200] if errors else None,
            "foreign": self.foreign,
        }


def spread_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(seconds)

    def at(share: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 1)

    return {"count": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def one_system(pair: Pair, settings: Settings) -> dict[str, Any]:
    """The big request alone, then with the small requests beside it; the figures and the audit."""
    caller_url = pair.redis_urls[0]
    small, big = Calls(caller_url, SMALL), Calls(caller_url, BIG)
    big_payload = b"0:" + b"x" * (settings.big_bytes - 2)
    limit_s = settings.big_limit()
    conn = aioredis.Redis.from_url(caller_url)
    stop = asyncio.Event()
    collectors = [asyncio.create_task(calls.collect(stop)) for calls in (small, big)]
    numbers = iter(range(1_000_000))
    try:
        for _ in range(WARM_UP_REQUESTS):
            number = next(numbers)
            await small.push(
                conn, number, small.envelope(number, small_payload(number, settings.small_bytes), 60)
            )
            await _until(small.replied(number), 60.0, "a warm-up reply")
        await big.push(conn, 0, big.envelope(0, big_payload, int(limit_s)))
        await _until(big.replied(0), limit_s, "the big request's reply alone")
        await asyncio.sleep(PAUSE_S)
        # Made before the small requests start: encoding 8 MiB would hold up their schedule.
        raw_big = big.envelope(1, b"1:" + big_payload[2:], int(limit_s))
        pacer = asyncio.create_task(_pace(conn, small, numbers, settings))
        try:
            await asyncio.sleep(LEAD_S)
            await big.push(conn, 1, raw_big)
            await _until(big.replied(1), limit_s, "the big request's reply beside the small ones")
        finally:
            pacer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer
        await _until(
            lambda: small.answered() == len(small.pushed_at), SETTLE_S, "the small requests' replies"
        )
    finally:
        stop.set()
        await asyncio.gather(*collectors)
        await conn.aclose()
    return _figures(small, big)


async def _pace(conn: aioredis.Redis, small: Calls, numbers: Iterator[int], settings: Settings) -> None:
    started = time.perf_counter()
    for count in range(1_000_000):
        number = next(numbers)
        await small.push(
            conn, number, small.envelope(number, small_payload(number, settings.small_bytes), SMALL_EXP_S)
        )
        await asyncio.sleep(max(0.0, started + (count + 1) * settings.small_every_s - time.perf_counter()))


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> bool:
    """Wait for ``condition()``, at most ``timeout_s``; False (and a line on the console) if it never held."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            print(json.dumps({"gave_up_waiting_for": what, "after_s": round(timeout_s, 1)}), flush=True)
            return False
        await asyncio.sleep(0.02)
    return True


def _figures(small: Calls, big: Calls) -> dict[str, Any]:
    """The big request's times (to its first reply, which may be an error), the small requests' latency while
    it was on its way (pushed between its push and its reply), and the audit of both."""
    alone, beside = big.took_s(0), big.took_s(1)
    pushed, answered = big.pushed_at.get(1), big.replies.get(1)
    during = []
    if pushed is not None:
        end = answered[0].at if answered else float("inf")
        during = [
            took
            for number, at in small.pushed_at.items()
            if pushed <= at <= end and (took := small.took_s(number)) is not None
        ]
    errors = [found[0].err if (found := big.replies.get(number)) else None for number in (0, 1)]
    delivered = alone is not None and beside is not None and not any(errors)
    return {
        "big_alone_s": round(alone, 2) if alone is not None else None,
        "big_alone_error": errors[0] or None,
        "big_beside_small_s": round(beside, 2) if beside is not None else None,
        "big_beside_small_error": errors[1] or None,
        "big_ratio": round(beside / alone, 2) if delivered and alone and beside else None,
        "small_during_big": spread_ms(during),
        "small": small.audit(),
        "big": big.audit(),
    }


def _big_cell(found: dict[str, Any], phase: str) -> str:
    took, error = found[f"big_{phase}_s"], found[f"big_{phase}_error"]
    if took is None:
        return "no reply"
    return f"error after {took} s" if error else f"{took} s"


# --- the service ------------------------------------------------------------------------------------------


async def serve(redis_url: str, counts_path: Path, workers: int = 4) -> None:
    """Echo ``SMALL`` requests, answer ``BIG`` ones with their size and digest; on SIGTERM, write how many
    times each request (by command and number) was executed to ``counts_path``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    executions: Counter[str] = Counter()

    async def worker(cmd: str) -> None:
        conn = aioredis.Redis.from_url(redis_url)
        try:
            while not stop.is_set():
                item = await conn.brpop([keys.command_queue(cmd)], timeout=1)
                if item is None:
                    continue
                request = Envelope.decode(item[1])
                payload = request.payload
                number = int(payload.partition(b":")[0])
                executions[f"{cmd}:{number}"] += 1
                answer = big_answer(number, payload) if cmd == BIG else payload
                reply = request.replace(
                    src=request.dst[0], dst=(request.src,), dat=encode_payload(answer), sig=""
                )
                await conn.lpush(keys.REPLY, reply.encode())
        finally:
            await conn.aclose()

    await asyncio.gather(*(worker(SMALL) for _ in range(workers)), worker(BIG))
    # The loop has nothing else to do by now.
    counts_path.write_text(json.dumps(executions))  # noqa: ASYNC240


# --- the run ----------------------------------------------------------------------------------------------


def run(settings: Settings) -> dict[str, dict[str, Any]]:
    """Both systems' figures, by system."""
    results: dict[str, dict[str, Any]] = {}
    with two_hosts() as (bed, caller, callee), contextlib.ExitStack() as stack:
        pairs = [stack.enter_context(msgbus_pair(caller, callee, ["--log-level", "info"], settings.key_type))]
        if settings.peer_bin:
            pairs.append(
                stack.enter_context(go_rmb_pair(settings.peer_bin, caller, callee, log_level="info"))
            )
        stack.enter_context(bed.thin(callee, settings.kbit))
        try:
            for pair in pairs:
                results[pair.system] = _run_pair(pair, settings)
                print(json.dumps({"system": pair.system, **results[pair.system]}), flush=True)
        finally:
            for pair in pairs:
                keep_logs(pair, settings.logs_dir, "thin")
    return results


def _run_pair(pair: Pair, settings: Settings) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="msgbus-thin-") as workdir:
        counts_path = Path(workdir) / "executions.json"
        with service("bench.thin_link", "--serve", pair.redis_urls[1], "--counts", str(counts_path)):
            figures = asyncio.run(one_system(pair, settings))
        try:
            executions = json.loads(counts_path.read_text())
        except (OSError, ValueError):
            executions = None
    figures["executed_twice"] = None if executions is None else sum(1 for n in executions.values() if n > 1)
    figures["daemon_warnings"] = _warnings(pair)
    return figures


def _warnings(pair: Pair) -> dict[str, Any]:
    """How many lines of each daemon's log are warnings or errors (msgbusd's JSON lines, go-rmb's coloured
    text), and the first of them."""
    found: dict[str, Any] = {}
    for role, path in pair.logs.items():
        text = path.read_text(errors="replace") if path.exists() else ""
        lines = [_ANSI.sub("", line) for line in text.splitlines()]
        troubles = [line for line in lines if _TROUBLE.search(line)]
        found[role] = len(troubles)
        if troubles:
            found[f"{role}_first"] = troubles[0][:240]
    return found


def table(results: dict[str, dict[str, Any]], settings: Settings) -> str:
    lines = [
        f"| system | big request ({settings.big_bytes / 2**20:g} MiB) alone | beside the small ones | ratio "
        "| small requests during it | small p50 / p99 / max ms | lost | doubled | executed twice | errors |",
        "|---|---:|---:|---:|---:|---:|---|---|---|---|",
    ]
    for system, found in results.items():
        spread = found["small_during_big"]
        small, big = found["small"], found["big"]
        cells = [
            system,
            _big_cell(found, "alone"),
            _big_cell(found, "beside_small"),
            f"{found['big_ratio']}x" if found["big_ratio"] is not None else "–",
            spread["count"],
            f"{spread['p50_ms']} / {spread['p99_ms']} / {spread['max_ms']}",
            f"{small['lost']} small, {big['lost']} big",
            f"{small['doubled']} small, {big['doubled']} big",
            found["executed_twice"],
            f"{small['errors']} small, {big['errors']} big"
            + (f": {big['first_error']}" if big["first_error"] else ""),
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


SMALL_P99_LIMIT_MS = 1000.0
BIG_RATIO_LIMIT = 1.2


def verdicts(results: dict[str, dict[str, Any]]) -> str:
    """msgbus's figures against the targets, go-rmb's of the same run beside them."""
    ours, peer = results.get("msgbus"), results.get("go-rmb")
    if ours is None:
        return ""
    p99 = ours["small_during_big"]["p99_ms"]
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines.append(
        f"| small requests' p99 <= 1 s | {p99} ms | {_yes(p99 is not None and p99 <= SMALL_P99_LIMIT_MS)} |"
    )
    if peer is not None:
        theirs = peer["small_during_big"]["p99_ms"]
        failed = (
            " (go-rmb's big request failed: its window is the failed attempt)"
            if peer["big"]["errors"]
            else ""
        )
        met = p99 is not None and theirs is not None and p99 <= theirs
        lines.append(f"| ... no worse than go-rmb's | {p99} against {theirs} ms{failed} | {_yes(met)} |")
    ratio = ours["big_ratio"]
    in_time = ratio is not None and ratio <= BIG_RATIO_LIMIT
    lines.append(f"| big request <= 1.2x its time alone | {_cell(ratio)}x | {_yes(in_time)} |")
    wrong = sum(
        ours[kind][key] for kind in ("small", "big") for key in ("lost", "doubled", "damaged", "errors")
    )
    wrong += ours["executed_twice"] or 0
    what = f"{wrong} lost, doubled, damaged, failed or executed twice"
    lines.append(f"| nothing lost or doubled | {what} | {_yes(wrong == 0)} |")
    return "\n".join(lines)


def _yes(met: bool) -> str:
    return "yes" if met else "no"


def _cell(value: object) -> str:
    return "–" if value is None else str(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kbit", type=int, default=Settings.kbit, help="the thin link's rate, each way")
    parser.add_argument("--big-mib", type=float, default=8.0, help="the big request's payload, MiB")
    parser.add_argument("--small-bytes", type=int, default=Settings.small_bytes)
    parser.add_argument("--small-every-ms", type=float, default=Settings.small_every_s * 1000)
    parser.add_argument(
        "--big-limit", type=float, default=0.0, help="seconds the big request may take (0: auto)"
    )
    parser.add_argument("--key-type", default=Settings.key_type)
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also measure two go-rmb daemons of this build")
    parser.add_argument("--logs", type=Path, help="copy the daemons' logs into this directory")
    parser.add_argument("--json", action="store_true", help="end with the figures as one JSON line")
    parser.add_argument("--serve", metavar="REDIS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--counts", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, args.counts))
        return
    settings = Settings(
        kbit=args.kbit,
        big_bytes=int(args.big_mib * 1024 * 1024),
        small_bytes=args.small_bytes,
        small_every_s=args.small_every_ms / 1000,
        big_limit_s=args.big_limit,
        key_type=args.key_type,
        peer_bin=args.peer_bin,
        logs_dir=args.logs,
    )
    reason = require_netbed()
    if reason is not None:
        print(f"bench.thin_link skipped: {reason}")
        return
    started = time.monotonic()
    results = run(settings)
    took_s = time.monotonic() - started
    print(f"\n{table(results, settings)}\n\n{verdicts(results)}\n\n({took_s:.0f} s)")
    if args.json:
        print(json.dumps({"settings": asdict(settings), "results": results}, default=str))


if __name__ == "__main__":
    main()
