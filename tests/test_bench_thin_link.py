"""The thin-link benchmark's tables for each mix: the other way's big request when big ones cross each way,
and msgbus judged against go-rmb's p50 and p99 of the same run."""

from __future__ import annotations

from typing import Any

from bench.thin_link import Settings, big_answer, table, verdicts

CLEAN = {"pushed": 2, "lost": 0, "doubled": 0, "damaged": 0, "errors": 0, "first_error": None, "foreign": 0}


def figures(p50_ms: float, p99_ms: float, *, both_ways: bool, small_lost: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = {
        "big_alone_s": 13.0,
        "big_alone_error": None,
        "big_beside_small_s": 15.6,
        "big_beside_small_error": None,
        "big_ratio": 1.2,
        "big": CLEAN,
        "small_during_big": {"count": 780, "p50_ms": p50_ms, "p99_ms": p99_ms, "max_ms": p99_ms + 100},
        "small": {**CLEAN, "pushed": 838, "lost": small_lost},
        "executed_twice": 0,
    }
    if both_ways:
        found |= {
            "reverse_alone_s": 13.6,
            "reverse_alone_error": None,
            "reverse_beside_small_s": 17.0,
            "reverse_beside_small_error": None,
            "reverse_ratio": 1.25,
            "reverse": CLEAN,
        }
    return found


def test_a_run_with_big_requests_each_way_shows_and_judges_the_other_way_too() -> None:
    settings = Settings(big_bytes=2**20, echo=True, both_ways=True, small_every_s=0.02)
    results = {
        "msgbus": figures(300.0, 900.0, both_ways=True),
        "go-rmb": figures(370.0, 1470.0, both_ways=True, small_lost=4),
    }
    made = table(results, settings).splitlines()
    assert (
        made[0] == "1 MiB with its echo, one each way at once, small requests at 50/s, 2000 kbit/s each way:"
    )
    assert "the other way alone / beside (ratio)" in made[2]
    rows = [line for line in made if line.startswith("| msgbus") or line.startswith("| go-rmb")]
    assert "| 13.6 s / 17.0 s (1.25x) |" in rows[0]
    assert "| 4 small, 0 big |" in rows[1]
    assert all(line.count("|") == made[3].count("|") for line in rows)
    judged = verdicts(results)
    assert "| ... p99 no worse than go-rmb's | 900.0 against 1470.0 ms | yes |" in judged
    assert "| ... p50 no worse than go-rmb's | 300.0 against 370.0 ms | yes |" in judged
    assert "| the other way's big request <= 1.2x its time alone | 1.25x | no |" in judged


def test_a_run_one_way_has_no_column_for_the_other_way() -> None:
    settings = Settings()
    made = table({"msgbus": figures(500.0, 800.0, both_ways=False)}, settings)
    assert "other way" not in made and "a small reply" in made.splitlines()[0]
    assert "other way" not in verdicts({"msgbus": figures(500.0, 800.0, both_ways=False)})


def test_the_big_request_s_reply_is_its_digest_or_with_echo_itself() -> None:
    payload = b"7:" + b"x" * 100
    assert big_answer(7, payload, echo=True) == payload
    assert big_answer(7, payload).startswith(b"7:102:")
