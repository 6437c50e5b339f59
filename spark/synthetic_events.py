"""Synthetic event log lines for one chunk of requests: realistic shapes, not a simulation.

Every request follows the daemon's path (accepted, sent with retries, received, handed to the service,
reply taken and sent back, delivered) with lognormal latencies per hop, a per-destination speed and
failure profile, and per-host clock offsets (sites on one host share a clock). A few requests fail all
their tries, expire, or are never answered; doors reject some messages. Lines are built with string
formatting, the random draws made per chunk with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

from wire import event_schema as ev

COMMANDS: Final = (  # command, median service time in ms
    ("calc.add", 1.0),
    ("zos.statistics.get", 5.0),
    ("zos.deployment.get", 20.0),
    ("storage.get", 10.0),
    ("storage.put", 40.0),
    ("chat.send", 3.0),
)
SEND_ERRORS: Final = (  # error text, HTTP status (0: none); the first is the most frequent
    ("connection refused", 0),
    ("connection refused", 0),
    ("timed out after 10s", 0),
    ("HTTP 502: bad gateway", 502),
    ("HTTP 503: service unavailable", 503),
)
REJECT_ERRORS: Final = ((401, "signature verification failed"), (400, "envelope does not decode"))
MAX_TRIES: Final = 3
RETRY_DELAY_MS: Final = 5000
EXPIRATION_S: Final = 60
MALFORMED_LINES: Final = (
    '{"ts":17953000000',  # cut short
    "not json at all",
    '{"ts":"yesterday","site":1,"host":"h1","event":"sent"}',  # wrong type
    '{"site":1,"host":"h1","event":"sent","uid":"2.1"}',  # no ts
    '{"ts":1795300000000000,"site":1,"host":"h1","event":"teleported"}',  # unknown event
)


@dataclass(frozen=True)
class Rates:
    """Probabilities per request (per line for the last two)."""

    send_failure: float = 0.03  # one attempt fails (more for flaky destinations)
    expired: float = 0.005
    unanswered: float = 0.001
    reply_failure: float = 0.005
    duplicate_copy: float = 0.002  # the destination logs a re-sent copy
    rejected: float = 0.002
    duplicate_line: float = 0.0  # an exact copy of a line
    malformed_line: float = 0.0


@dataclass(frozen=True)
class Topology:
    """Sites, the host each runs on, its clock offset, and each destination's speed and failure factor."""

    sites: int
    hosts: int
    seed: int = 1
    host_offset_us: list[int] = field(init=False)
    dst_speed: list[float] = field(init=False)
    dst_failure: list[float] = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        # Host 0's clock is the reference; the others are off by up to ±50 ms.
        offsets = [0, *rng.integers(-50_000, 50_000, size=max(0, self.hosts - 1)).tolist()]
        speed = rng.lognormal(0.0, 0.5, size=self.sites).tolist()
        failure = [10.0 if index == self.sites - 1 and self.sites > 2 else 1.0 for index in range(self.sites)]
        object.__setattr__(self, "host_offset_us", offsets)
        object.__setattr__(self, "dst_speed", speed)
        object.__setattr__(self, "dst_failure", failure)

    def host_of(self, site: int) -> int:
        """Sites 1..S are spread over hosts round-robin."""
        return (site - 1) % self.hosts


@dataclass(frozen=True)
class Draws:
    """The random draws for a batch of requests, as Python lists (indexing them is what the loop does)."""

    t0: list[float]
    src: list[int]
    hop: list[int]  # the destination is this many sites after the source, so never the source itself
    cmd: list[int]
    queue_us: list[float]
    send_us: list[float]
    service: list[float]  # factor on the command's median service time
    reply_us: list[float]
    nbytes: list[int]
    uniform: list[
        list[float]
    ]  # per request: failures, error kind, duplicate, lost/expired, reply failure, reject

    @classmethod
    def make(cls, rng: np.random.Generator, size: int, sites: int, start_us: int, span_us: int) -> Draws:
        return cls(
            t0=(start_us + rng.random(size) * span_us).tolist(),
            src=rng.integers(1, sites + 1, size=size).tolist(),
            hop=rng.integers(1, max(2, sites), size=size).tolist(),
            cmd=rng.integers(0, len(COMMANDS), size=size).tolist(),
            queue_us=rng.lognormal(np.log(400.0), 0.8, size=size).tolist(),
            send_us=rng.lognormal(np.log(900.0), 0.5, size=size).tolist(),
            service=rng.lognormal(0.0, 0.7, size=size).tolist(),
            reply_us=rng.lognormal(np.log(700.0), 0.5, size=size).tolist(),
            nbytes=rng.lognormal(np.log(200.0), 1.0, size=size).astype(int).tolist(),
            uniform=rng.random((size, 6)).tolist(),
        )


def _line(fields: dict[str, object]) -> str:
    parts = []
    for name, value in fields.items():
        if value is None:
            continue
        parts.append(f'"{name}":{value}' if isinstance(value, int) else f'"{name}":"{value}"')
    return "{" + ",".join(parts) + "}"


class ChunkWriter:
    """Builds the lines of one chunk, grouped by the site that writes them."""

    def __init__(self, topology: Topology, rates: Rates, start_us: int, span_us: int, seed: int) -> None:
        self.topology = topology
        self.rates = rates
        self.start_us = start_us
        self.span_us = span_us
        self.rng = np.random.default_rng(seed)
        self.lines: dict[int, list[str]] = {site: [] for site in range(1, topology.sites + 1)}
        self.events = 0

    def _emit(self, site: int, real_us: float, event: str, **fields: object) -> None:
        host = self.topology.host_of(site)
        ts = int(real_us) + self.topology.host_offset_us[host]
        line = _line({ev.TS: ts, ev.SITE: site, ev.HOST: f"h{host + 1}", ev.EVENT: event, **fields})
        self.lines[site].append(line)
        self.events += 1

    def fill(self, target_events: int, first_number: int, batch: int = 20_000) -> None:
        """Add requests (numbered from ``first_number``) until ``target_events`` lines; cut the last one."""
        number = first_number
        while self.events < target_events:
            number = self._batch(batch, number, target_events)
        self._add_noise()

    def _batch(self, size: int, number: int, target_events: int) -> int:
        draws = Draws.make(self.rng, size, self.topology.sites, self.start_us, self.span_us)
        sites = self.topology.sites
        for i in range(size):
            if self.events >= target_events:
                break
            s = draws.src[i]
            d = (s - 1 + draws.hop[i]) % sites + 1 if sites > 1 else s
            self._request(number, s, d, draws, i)
            number += 1
        self._cut(target_events)
        return number

    def _request(self, number: int, s: int, d: int, draws: Draws, i: int) -> None:
        rates, speed = self.rates, self.topology.dst_speed[d - 1]
        cmd, service_ms = COMMANDS[draws.cmd[i]]
        u = draws.uniform[i]
        uid = f"{d}.{number}"
        ret = f"{number * 2654435761 % 2**48:012x}"
        key = {ev.UID: uid, ev.CMD: cmd, ev.SRC: s, ev.DST: d}
        accepted = t = draws.t0[i]
        self._emit(s, t, ev.ACCEPTED, uid=uid, ret=ret, cmd=cmd, src=s, dst=d, bytes=draws.nbytes[i])
        t += draws.queue_us[i]
        failure_rate = min(0.5, rates.send_failure * self.topology.dst_failure[d - 1])
        failures = 0
        while failures < MAX_TRIES and u[0] < failure_rate ** (failures + 1):
            failures += 1
            error, status = SEND_ERRORS[(int(u[1] * 1000) + failures) % len(SEND_ERRORS)]
            duration = int(draws.send_us[i] * 3 * speed)
            t += duration
            status_field = status or None
            self._emit(
                s,
                t,
                ev.SEND_FAILED,
                **key,
                attempt=failures,
                status=status_field,
                duration_us=duration,
                error=error,
            )
            if failures == MAX_TRIES:
                self._emit(s, t + 50, ev.FAILED, **key, error=f"all retries done: {error}")
                return
            delay_ms = RETRY_DELAY_MS * 2 ** (failures - 1)
            self._emit(s, t + 20, ev.RETRY_SCHEDULED, **key, attempt=failures, delay_ms=delay_ms)
            t += delay_ms * 1000
        duration = int(draws.send_us[i] * speed)
        self._emit(d, t + duration * 0.6, ev.RECEIVED, **key, bytes=draws.nbytes[i])
        self._emit(s, t + duration, ev.SENT, **key, attempt=failures + 1, status=200, duration_us=duration)
        if u[2] < rates.duplicate_copy:
            self._emit(d, t + duration + 1000, ev.DUPLICATE, **key)
        t += duration * 0.6 + 80
        self._emit(d, t, ev.HANDED_TO_SERVICE, **key, queue=f"msgbus.{cmd}")
        if u[3] < rates.unanswered:
            return
        if u[3] < rates.unanswered + rates.expired:
            timeout = f"request timeout (expiration reached, {EXPIRATION_S})"
            self._emit(s, accepted + EXPIRATION_S * 1_000_000, ev.EXPIRED, **key, error=timeout)
            return
        t += service_ms * 1000 * draws.service[i] * speed
        self._emit(d, t, ev.REPLY_TAKEN, **key)
        reply_duration = int(draws.reply_us[i] * speed)
        attempt = 1
        if u[4] < rates.reply_failure:
            t += reply_duration
            self._emit(d, t, ev.REPLY_FAILED, **key, attempt=1, error="connection reset by peer")
            t += RETRY_DELAY_MS * 1000
            attempt = 2
        t += 150
        self._emit(s, t + reply_duration * 0.6, ev.REPLY_RECEIVED, **key)
        self._emit(
            d,
            t + reply_duration,
            ev.REPLY_SENT,
            **key,
            attempt=attempt,
            status=200,
            duration_us=reply_duration,
        )
        self._emit(s, t + reply_duration * 0.6 + 90, ev.DELIVERED, **key, ret=ret)
        if u[5] < rates.rejected:
            site = (d % self.topology.sites) + 1
            status, text = REJECT_ERRORS[number % len(REJECT_ERRORS)]
            self._emit(
                site, t, ev.REJECTED, src=s if number % 2 else None, dst=site, status=status, error=text
            )

    def _cut(self, target_events: int) -> None:
        """Drop the newest lines beyond the target: the log ends mid-request, as a real one does."""
        while self.events > target_events:
            for lines in self.lines.values():
                if self.events > target_events and lines:
                    lines.pop()
                    self.events -= 1

    def _add_noise(self) -> None:
        for site, lines in self.lines.items():
            copies = int(self.rng.binomial(len(lines), self.rates.duplicate_line)) if lines else 0
            broken = int(self.rng.binomial(len(lines), self.rates.malformed_line)) if lines else 0
            picks = self.rng.integers(0, max(1, len(lines)), size=copies).tolist()
            lines.extend(lines[index] for index in picks)
            lines.extend(
                MALFORMED_LINES[index % len(MALFORMED_LINES)] for index in range(site, site + broken)
            )
            # Every line starts with {"ts": and a 16-digit time, so text order is time order.
            lines.sort()
