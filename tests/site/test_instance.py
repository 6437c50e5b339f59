"""How the site's instances share leases, and how one knows another's process is gone."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter

from msgbusd.site.instance import pick
from msgbusd.site.process_info import ProcessInfo

NAMES = [str(twin) for twin in range(3000)]


def test_leases_spread_over_the_live_instances() -> None:
    spread = Counter(pick(name, ["a", "b", "c"]) for name in NAMES)
    assert set(spread) == {"a", "b", "c"}
    assert min(spread.values()) > len(NAMES) / 3 * 0.8


def test_when_an_instance_goes_only_its_leases_move() -> None:
    before = {name: pick(name, ["a", "b", "c"]) for name in NAMES}
    after = {name: pick(name, ["a", "b"]) for name in NAMES}
    moved = {name for name in NAMES if before[name] != after[name]}
    assert moved == {name for name in NAMES if before[name] == "c"}


def test_a_process_that_exited_on_this_machine_is_known_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here = ProcessInfo.this()
    assert not here.gone()
    assert dataclasses.replace(here, pid=child.pid, start="1").gone()
    # This pid, started at another time: a process before this one that had the same pid.
    assert dataclasses.replace(here, start=here.start + "0").gone()


def test_a_process_elsewhere_is_never_taken_for_gone() -> None:
    here = ProcessInfo.this()
    assert not dataclasses.replace(here, host=here.host + "-other", pid=999_999).gone()
    assert not dataclasses.replace(here, boot="another boot", pid=999_999).gone()
    assert ProcessInfo.from_json(here.to_json()) == here
    assert ProcessInfo.from_json("not json") is None
