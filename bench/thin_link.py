"""A thin link: two sites on two hosts of the network test bed, the callee's link shaped to ``--kbit`` each
way (2 Mbit/s by default), msgbus's pair and go-rmb's pair (``--peer-bin``) on the same hosts, one after the
other in the same run.

For each system: a few small requests to open what it keeps open; then a big request (``--big-mib``, 8 MiB
by default; its reply is small: the size and digest of what the service got, or with ``--echo`` the request
itself, as big) alone, timed from push to reply; then the same big request again while the caller's site
sends a small request (``--small-bytes``) every ``--small-every-ms`` to an echo service beside it, from a
little before the big one is pushed until its reply is back. With ``--both-ways`` the callee's site sends the
caller's an equally big request at the same moments (alone, and beside the small ones), so that big
messages cross the cable each way at once. Reported: the small requests' latency while the big ones were on
their way (p50, p99, max), each big one's time against its time alone, and every request that got no reply,
a second reply, a reply with another payload, an error, or was executed twice by a service.

    python -m bench.thin_link [--kbit 2000] [--big-mib 8] [--echo] [--both-ways] [--small-every-ms 150]
                              [--peer-bin GO_RMB] [--trace DIR] [--json]
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

from bench.bed_sites import (
    CALLEE_TWIN,
    CALLER_TWIN,
    Pair,
    go_rmb_pair,
    keep_logs,
    msgbus_pair,
    service,
    two_hosts,
)
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
    # The big request's reply is the request itself (else its size and digest).
    echo: bool = False
    # The callee's site sends the caller's an equally big request at the same moments.
    both_ways: bool = False
    # How long the big request may take at most (0: three times its time at the link's rate, plus a minute).
    big_limit_s: float = 0.0
    key_type: str = "ed25519"
    peer_bin: str | None = None
    logs_dir: Path | None = None
    # Each request's push and latency, by system, as CSV files in this directory.
    trace_dir: Path | None = None

    def big_limit(self) -> float:
        if self.big_limit_s > 0:
            return self.big_limit_s
        # base64 in JSON: 4/3 of the payload crosses the link (twice with an echo and both ways).
        crossings = 2 if self.echo and self.both_ways else 1
        return 3 * crossings * self.big_bytes * 4 / 3 * 8 / (self.kbit * 1000) + 60

    def mix(self) -> str:
        """The mix in words, for the table."""
        reply = "its echo" if self.echo else "a small reply"
        ways = ", one each way at once" if self.both_ways else ""
        rate = 1 / self.small_every_s
        return (
            f"{self.big_bytes / 2**20:g} MiB with {reply}{ways}, small requests at {rate:g}/s, "
            f"{self.kbit} kbit/s each way"
        )


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def small_payload(number: int, size: int) -> bytes:
    return b"%d:" % number + b"x" * size


def big_answer(number: int, payload: bytes, *, echo: bool = False) -> bytes:
    """The service's reply to a big request: its number, the size and the digest of what it got; with
    ``echo``, the request itself."""
    return payload if echo else f"{number}:{len(payload)}:{_digest(payload)}".encode()


@dataclass
class Reply:
    at: float
    err: str
    intact: bool


class Calls:
    """Requests to ``cmd`` at twin 2 from the caller's site, numbered from 0 (the number opens the payload),
    their replies on one return queue, collected with the time each came."""

    def __init__(self, redis_url: str, cmd: str, *, dst: int = CALLEE_TWIN, echo: bool = False) -> None:
        self.redis_url = redis_url
        self.cmd = cmd
        self.dst = dst
        self.echo = echo
        self.ret = f"bench.thin.{cmd}.{uuid.uuid4().hex[:8]}"
        self.pushed_at: dict[int, float] = {}
        self.expected: dict[int, bytes] = {}
        self.replies: dict[int, list[Reply]] = {}
        self.foreign = 0

    def envelope(self, number: int, payload: bytes, exp_s: int) -> bytes:
        self.expected[number] = big_answer(number, payload, echo=self.echo) if self.cmd == BIG else payload
        return Envelope(
            uid=str(number),
            cmd=self.cmd,
            exp=exp_s,
            dat=encode_payload(payload),
            dst=(self.dst,),
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
    """The big request(s) alone, then with the small requests beside them; the figures and the audit."""
    caller_url, callee_url = pair.redis_urls
    small = Calls(caller_url, SMALL)
    bigs = [Calls(caller_url, BIG, echo=settings.echo)]
    if settings.both_ways:
        bigs.append(Calls(callee_url, BIG, dst=CALLER_TWIN, echo=settings.echo))
    big_payload = b"0:" + b"x" * (settings.big_bytes - 2)
    limit_s = settings.big_limit()
    conn = aioredis.Redis.from_url(caller_url)
    big_conns = [conn, *(aioredis.Redis.from_url(big.redis_url) for big in bigs[1:])]
    stop = asyncio.Event()
    collectors = [asyncio.create_task(calls.collect(stop)) for calls in (small, *bigs)]
    numbers = iter(range(1_000_000))
    try:
        for _ in range(WARM_UP_REQUESTS):
            number = next(numbers)
            await small.push(
                conn, number, small.envelope(number, small_payload(number, settings.small_bytes), 60)
            )
            await _until(small.replied(number), 60.0, "a warm-up reply")
        alone = [big.envelope(0, big_payload, int(limit_s)) for big in bigs]
        await asyncio.gather(
            *(big.push(c, 0, raw) for big, c, raw in zip(bigs, big_conns, alone, strict=True))
        )
        await _until(
            lambda: all(big.replied(0)() for big in bigs), limit_s, "the big requests' replies alone"
        )
        await asyncio.sleep(PAUSE_S)
        # Made before the small requests start: encoding 8 MiB would hold up their schedule.
        beside = [big.envelope(1, b"1:" + big_payload[2:], int(limit_s)) for big in bigs]
        pacing = asyncio.Event()
        pacer = asyncio.create_task(_pace(conn, small, numbers, settings, pacing))
        try:
            await asyncio.sleep(LEAD_S)
            pushes = (big.push(c, 1, raw) for big, c, raw in zip(bigs, big_conns, beside, strict=True))
            await asyncio.gather(*pushes)
            await _until(
                lambda: all(big.replied(1)() for big in bigs),
                limit_s,
                "the big requests' replies beside the small ones",
            )
        finally:
            # Told, not cancelled: a cancellation that lands inside a Redis command can be lost in it.
            pacing.set()
            await pacer
        await _until(
            lambda: small.answered() == len(small.pushed_at), SETTLE_S, "the small requests' replies"
        )
    finally:
        stop.set()
        await asyncio.gather(*collectors)
        for each in big_conns:
            await each.aclose()
    if settings.trace_dir is not None:
        write_trace(settings.trace_dir / f"thin-{pair.system}.csv", small, bigs)
    return _figures(small, bigs)


def write_trace(path: Path, small: Calls, bigs: Sequence[Calls]) -> None:
    """One line per request: which (small, big, reverse), its number, when it was pushed (seconds from the
    first push) and how long its first reply took (empty: none came)."""
    calls = [("small", small), *zip(("big", "reverse"), bigs, strict=False)]
    start = min(at for _, each in calls for at in each.pushed_at.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write("kind,number,pushed_s,took_s\n")
        for kind, each in calls:
            for number, at in sorted(each.pushed_at.items()):
                took = each.took_s(number)
                out.write(f"{kind},{number},{at - start:.3f},{'' if took is None else f'{took:.3f}'}\n")


async def _pace(
    conn: aioredis.Redis, small: Calls, numbers: Iterator[int], settings: Settings, stop: asyncio.Event
) -> None:
    """Push a small request every ``settings.small_every_s`` until ``stop``."""
    started = time.perf_counter()
    count = 0
    while not stop.is_set():
        number = next(numbers)
        await small.push(
            conn, number, small.envelope(number, small_payload(number, settings.small_bytes), SMALL_EXP_S)
        )
        count += 1
        next_s = started + count * settings.small_every_s - time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_s))


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> bool:
    """Wait for ``condition()``, at most ``timeout_s``; False (and a line on the console) if it never held."""
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            print(json.dumps({"gave_up_waiting_for": what, "after_s": round(timeout_s, 1)}), flush=True)
            return False
        await asyncio.sleep(0.02)
    return True


def _figures(small: Calls, bigs: Sequence[Calls]) -> dict[str, Any]:
    """Each big request's times (to its first reply, which may be an error: ``big_*`` the caller's, and
    ``reverse_*`` the callee's with ``--both-ways``), the small requests' latency while they were on their
    way (pushed between the first big one's push and the last one's reply), and the audit of all."""
    figures: dict[str, Any] = {}
    window: list[float] = []
    for name, big in zip(("big", "reverse"), bigs, strict=False):
        alone, beside = big.took_s(0), big.took_s(1)
        pushed, answered = big.pushed_at.get(1), big.replies.get(1)
        if pushed is not None:
            window += [pushed, answered[0].at if answered else float("inf")]
        errors = [found[0].err if (found := big.replies.get(number)) else None for number in (0, 1)]
        delivered = alone is not None and beside is not None and not any(errors)
        figures |= {
            f"{name}_alone_s": round(alone, 2) if alone is not None else None,
            f"{name}_alone_error": errors[0] or None,
            f"{name}_beside_small_s": round(beside, 2) if beside is not None else None,
            f"{name}_beside_small_error": errors[1] or None,
            f"{name}_ratio": round(beside / alone, 2) if delivered and alone and beside else None,
            name: big.audit(),
        }
    during = []
    if window:
        start, end = min(window), max(window)
        during = [
            took
            for number, at in small.pushed_at.items()
            if start <= at <= end and (took := small.took_s(number)) is not None
        ]
    return {**figures, "small_during_big": spread_ms(during), "small": small.audit()}


def _big_cell(found: dict[str, Any], name: str, phase: str) -> str:
    took, error = found[f"{name}_{phase}_s"], found[f"{name}_{phase}_error"]
    if took is None:
        return "no reply"
    return f"error after {took} s" if error else f"{took} s"


# --- the service ------------------------------------------------------------------------------------------


async def serve(redis_url: str, counts_path: Path, *, echo: bool = False, workers: int = 4) -> None:
    """Echo ``SMALL`` requests, answer ``BIG`` ones with their size and digest (or, with ``echo``, with
    themselves); on SIGTERM, write how many times each request (by command and number) was executed to
    ``counts_path``."""
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
                answer = big_answer(number, payload, echo=echo) if cmd == BIG else payload
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
    # The callee's services, and with --both-ways the caller's too.
    sites = pair.redis_urls[::-1] if settings.both_ways else pair.redis_urls[1:]
    with tempfile.TemporaryDirectory(prefix="msgbus-thin-") as workdir, contextlib.ExitStack() as services:
        counts = [Path(workdir) / f"executions-{n}.json" for n in range(len(sites))]
        for url, path in zip(sites, counts, strict=True):
            args = ["--serve", url, "--counts", str(path), *(["--echo"] if settings.echo else [])]
            services.enter_context(service("bench.thin_link", *args))
        figures = asyncio.run(one_system(pair, settings))
        services.close()
        twice = [_executed_twice(path) for path in counts]
    figures["executed_twice"] = None if None in twice else sum(n for n in twice if n is not None)
    figures["daemon_warnings"] = _warnings(pair)
    return figures


def _executed_twice(counts_path: Path) -> int | None:
    """How many requests a service executed more than once, as it wrote (None: it wrote nothing)."""
    try:
        executions = json.loads(counts_path.read_text())
    except (OSError, ValueError):
        return None
    return sum(1 for n in executions.values() if n > 1)


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
    other_way = " | the other way alone / beside (ratio)" if settings.both_ways else ""
    lines = [
        f"{settings.mix()}:",
        "",
        f"| system | big request ({settings.big_bytes / 2**20:g} MiB) alone | beside the small ones | ratio"
        f"{other_way} | small requests during it | small p50 / p99 / max ms | lost | doubled "
        "| executed twice | errors |",
        "|---|---:|---:|---:|" + ("---:|" if settings.both_ways else "") + "---:|---:|---|---|---|---|",
    ]
    for system, found in results.items():
        spread = found["small_during_big"]
        small = found["small"]
        bigs = [found["big"], *([found["reverse"]] if "reverse" in found else [])]
        first_error = next((big["first_error"] for big in bigs if big["first_error"]), None)
        cells = [
            system,
            _big_cell(found, "big", "alone"),
            _big_cell(found, "big", "beside_small"),
            _ratio(found["big_ratio"]),
            *(
                [
                    f"{_big_cell(found, 'reverse', 'alone')} / {_big_cell(found, 'reverse', 'beside_small')} "
                    f"({_ratio(found['reverse_ratio'])})"
                ]
                if settings.both_ways
                else []
            ),
            spread["count"],
            f"{spread['p50_ms']} / {spread['p99_ms']} / {spread['max_ms']}",
            f"{small['lost']} small, {sum(big['lost'] for big in bigs)} big",
            f"{small['doubled']} small, {sum(big['doubled'] for big in bigs)} big",
            found["executed_twice"],
            f"{small['errors']} small, {sum(big['errors'] for big in bigs)} big"
            + (f": {first_error}" if first_error else ""),
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def _ratio(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio}x"


SMALL_P99_LIMIT_MS = 1000.0
BIG_RATIO_LIMIT = 1.2


def verdicts(results: dict[str, dict[str, Any]]) -> str:
    """msgbus's figures against the targets, go-rmb's of the same run beside them."""
    ours, peer = results.get("msgbus"), results.get("go-rmb")
    if ours is None:
        return ""
    p50, p99 = ours["small_during_big"]["p50_ms"], ours["small_during_big"]["p99_ms"]
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines.append(
        f"| small requests' p99 <= 1 s | {p99} ms | {_yes(p99 is not None and p99 <= SMALL_P99_LIMIT_MS)} |"
    )
    if peer is not None:
        their_p50, their_p99 = peer["small_during_big"]["p50_ms"], peer["small_during_big"]["p99_ms"]
        failed = (
            " (go-rmb's big request failed: its window is the failed attempt)"
            if any(peer[name]["errors"] for name in ("big", "reverse") if name in peer)
            else ""
        )
        met = p99 is not None and their_p99 is not None and p99 <= their_p99
        lines.append(
            f"| ... p99 no worse than go-rmb's | {p99} against {their_p99} ms{failed} | {_yes(met)} |"
        )
        met = p50 is not None and their_p50 is not None and p50 <= their_p50
        lines.append(f"| ... p50 no worse than go-rmb's | {p50} against {their_p50} ms | {_yes(met)} |")
    bigs = ["big", *(["reverse"] if "reverse" in ours else [])]
    for name in bigs:
        ratio = ours[f"{name}_ratio"]
        in_time = ratio is not None and ratio <= BIG_RATIO_LIMIT
        which = "big request" if name == "big" else "the other way's big request"
        lines.append(f"| {which} <= 1.2x its time alone | {_cell(ratio)}x | {_yes(in_time)} |")
    wrong = sum(
        ours[kind][key] for kind in ("small", *bigs) for key in ("lost", "doubled", "damaged", "errors")
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
    parser.add_argument("--echo", action="store_true", help="the big request's reply is as big as itself")
    parser.add_argument("--both-ways", action="store_true", help="a big request each way at once")
    parser.add_argument(
        "--big-limit", type=float, default=0.0, help="seconds the big request may take (0: auto)"
    )
    parser.add_argument("--key-type", default=Settings.key_type)
    parser.add_argument("--peer-bin", metavar="GO_RMB", help="also measure two go-rmb daemons of this build")
    parser.add_argument("--logs", type=Path, help="copy the daemons' logs into this directory")
    parser.add_argument("--trace", type=Path, help="write each request's latency into this directory")
    parser.add_argument("--json", action="store_true", help="end with the figures as one JSON line")
    parser.add_argument("--serve", metavar="REDIS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--counts", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, args.counts, echo=args.echo))
        return
    settings = Settings(
        kbit=args.kbit,
        big_bytes=int(args.big_mib * 1024 * 1024),
        small_bytes=args.small_bytes,
        small_every_s=args.small_every_ms / 1000,
        echo=args.echo,
        both_ways=args.both_ways,
        big_limit_s=args.big_limit,
        key_type=args.key_type,
        peer_bin=args.peer_bin,
        logs_dir=args.logs,
        trace_dir=args.trace,
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
