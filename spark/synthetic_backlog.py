"""Synthetic backlog snapshots (``msgbus backlog dump`` lines): pending entries of every kind with
lognormal ages, so that a few are older than their deadline.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from spark.synthetic_events import COMMANDS, EXPIRATION_S, RETRY_DELAY_MS
from wire import event_schema as ev

KIND_WEIGHTS: Final = {"request": 0.5, "retry": 0.15, "reply": 0.1, "queued": 0.2, "dead_letter": 0.05}


def _line(fields: dict[str, object]) -> str:
    parts = []
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, str):
            parts.append(f'"{name}":"{value}"')
        elif isinstance(value, float):
            parts.append(f'"{name}":{value:.3f}')
        else:
            parts.append(f'"{name}":{value}')
    return "{" + ",".join(parts) + "}"


def snapshot_lines(site: int, sites: int, taken_at_us: int, entries: int, seed: int) -> list[str]:
    """``entries`` lines of one site's snapshot taken at ``taken_at_us``."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(list(KIND_WEIGHTS), size=entries, p=list(KIND_WEIGHTS.values())).tolist()
    # Median 2 s; about 1 entry in 50 is older than the 60 s expiration.
    ages_s = rng.lognormal(np.log(2.0), 1.7, size=entries).tolist()
    dsts = rng.integers(1, sites + 1, size=entries).tolist()
    cmds = rng.integers(0, len(COMMANDS), size=entries).tolist()
    lines = []
    for index in range(entries):
        kind, age_s, cmd = kinds[index], ages_s[index], COMMANDS[cmds[index]][0]
        accepted_us = taken_at_us - int(age_s * 1_000_000)
        dead = kind == "dead_letter"
        fields: dict[str, object] = {
            ev.TAKEN_AT: taken_at_us,
            ev.SITE: site,
            ev.KIND: kind,
            ev.UID: f"{dsts[index]}.{seed % 1000}{index}",
            ev.CMD: cmd,
            ev.SRC: site,
            ev.DST: dsts[index],
            ev.RET: f"{index * 2654435761 % 2**48:012x}",
            ev.QUEUE: "msgbus.system.local" if kind == "queued" else None,
            ev.AGE_S: age_s,
            ev.DEADLINE: None
            if kind in ("queued", "dead_letter")
            else accepted_us + EXPIRATION_S * 1_000_000,
            ev.DUE: taken_at_us + RETRY_DELAY_MS * 1000 if kind in ("retry", "reply") else None,
            ev.ATTEMPT: 2 if kind == "retry" else None,
            ev.BYTES: 200 + index % 500,
            ev.ERROR: "envelope does not decode" if dead else None,
        }
        lines.append(_line(fields))
    return lines
