"""The JSON twin file: its checks, hex and SS58 accounts, and reload on change."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from twin_resolver import (
    AccountNotFound,
    Resolver,
    ResolverError,
    StaticResolver,
    Twin,
    TwinFileError,
    TwinNotFound,
    load_twin_file,
    write_twin_file,
)
from twin_resolver.accounts import ss58_encode

KEY_1 = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
KEY_2 = bytes.fromhex("46ebddef8cd9bb167dc30878d7113b7e168e6f0646beffd77d69d39bad76b47a")
KEY_3 = bytes.fromhex("345071da55e5dccefaaa440339415ef9f2663338a38f7da0df21be5ab4e055ef")
TWIN_1 = Twin(id=1, address="127.0.0.1:18051", public_key=KEY_1, name="edge-1")
TWIN_2 = Twin(id=2, address="300:1::2", public_key=KEY_2)
TWIN_3 = Twin(id=3, address="[300:1::3]:9000", public_key=KEY_3, name="edge-3")
# An edge that cannot be dialed: reached through its relay, with a key of its own to encrypt for.
TWIN_4 = Twin(
    id=4, address="", public_key=bytes(range(32)), relay="relay.example:8051", encryption_key=b"k" * 32
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _touch(path: Path, mtime_s: int) -> None:
    os.utime(path, ns=(mtime_s * 10**9, mtime_s * 10**9))


def _file_error(path: Path) -> str:
    with pytest.raises(TwinFileError) as caught:
        load_twin_file(path)
    return str(caught.value)


# --- the twin file ---------------------------------------------------------------------------------------


async def test_static_resolver_answers_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1, TWIN_2])
    resolver: Resolver = StaticResolver(path)
    assert await resolver.get_twin(1) == TWIN_1
    assert await resolver.get_twin(2) == TWIN_2
    assert await resolver.twin_id_by_public_key(KEY_2) == 2
    await resolver.aclose()


async def test_unknown_twin_and_account(tmp_path: Path) -> None:
    resolver = StaticResolver.from_twins([TWIN_1])
    with pytest.raises(TwinNotFound) as caught:
        await resolver.get_twin(9)
    assert caught.value.twin_id == 9 and str(caught.value) == "twin 9 not found"
    with pytest.raises(AccountNotFound) as missing:
        await resolver.twin_id_by_public_key(KEY_2)
    assert str(missing.value) == f"no twin found for account {ss58_encode(KEY_2)}"
    assert missing.value.public_key == KEY_2
    assert isinstance(missing.value, ResolverError) and isinstance(caught.value, ResolverError)


def test_accounts_in_hex_and_ss58(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "twins.json",
        {
            "twins": [
                {"id": 1, "ip": "1.2.3.4", "account": ss58_encode(KEY_1), "name": "a"},
                {"id": 2, "ip": "300:1::2", "account": KEY_2.hex()},
                {"id": 3, "ip": "", "account": "0x" + KEY_3.hex().upper(), "extra": True},
            ]
        },
    )
    twins = load_twin_file(path)
    assert twins == {
        1: Twin(1, "1.2.3.4", KEY_1, "a"),
        2: Twin(2, "300:1::2", KEY_2),
        3: Twin(3, "", KEY_3),
    }


def test_write_twin_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1, TWIN_2, TWIN_3, TWIN_4])
    assert load_twin_file(path) == {1: TWIN_1, 2: TWIN_2, 3: TWIN_3, 4: TWIN_4}
    entries = json.loads(path.read_text())["twins"]
    assert "name" not in entries[1]
    assert not {"relay", "pk"} & entries[1].keys()
    assert (entries[3]["relay"], entries[3]["pk"]) == ("relay.example:8051", (b"k" * 32).hex())
    assert [p.name for p in tmp_path.iterdir()] == ["twins.json"]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert _file_error(path) == f"{path}: twin file not found"
    with pytest.raises(TwinFileError, match="twin file not found"):
        StaticResolver(path)


def test_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    path.write_text('{"twins": [')
    assert _file_error(path).startswith(f"{path}: invalid JSON: ")


@pytest.mark.parametrize("doc", [[], {"twin": []}, {"twins": {}}, "x"])
def test_wrong_shape(tmp_path: Path, doc: Any) -> None:
    path = _write_json(tmp_path / "twins.json", doc)
    assert _file_error(path) == f'{path}: expected an object with a "twins" list'


GOOD = {"id": 1, "ip": "1.2.3.4", "account": KEY_1.hex()}


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("x", "expected an object"),
        ({"ip": "1.2.3.4"}, "missing key(s) id, account"),
        ({"id": 2, "account": KEY_2.hex()}, "missing key(s) ip"),
        ({**GOOD, "id": 2, "account": "nope"}, "bad account: 'nope' is neither 64 hex digits nor an SS58"),
        ({**GOOD, "id": 2, "account": KEY_2.hex()[:-2]}, "bad account: "),
        ({**GOOD, "id": 2, "account": 5}, "account must be a string, got 5"),
        ({**GOOD, "id": "2"}, "id must be a positive integer, got '2'"),
        ({**GOOD, "id": True}, "id must be a positive integer, got True"),
        ({**GOOD, "id": 0}, "id must be a positive integer, got 0"),
        ({**GOOD, "id": 2, "ip": None}, "ip must be a string, got None"),
        ({**GOOD, "id": 2, "account": KEY_2.hex(), "name": 3}, "name must be a string, got 3"),
        ({**GOOD, "id": 2, "account": KEY_2.hex(), "relay": 3}, "relay must be a string, got 3"),
        (
            {**GOOD, "id": 2, "account": KEY_2.hex(), "pk": "ab"},
            "pk must be 64 hex digits (an X25519 public key)",
        ),
        ({**GOOD, "id": 2, "account": KEY_2.hex(), "pk": 5}, "pk must be a string, got 5"),
    ],
)
def test_bad_entry_names_file_and_index(tmp_path: Path, entry: Any, reason: str) -> None:
    path = _write_json(tmp_path / "twins.json", {"twins": [GOOD, entry]})
    text = _file_error(path)
    assert text.startswith(f"{path}: twins[1]: {reason}")


def test_duplicate_ids(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "twins.json",
        {"twins": [GOOD, {"id": 2, "ip": "", "account": KEY_2.hex()}, {**GOOD, "account": KEY_3.hex()}]},
    )
    assert _file_error(path) == f"{path}: twins[2]: duplicate twin id 1 (also twins[0])"


def test_duplicate_accounts(tmp_path: Path) -> None:
    path = _write_json(tmp_path / "twins.json", {"twins": [GOOD, {**GOOD, "id": 2}]})
    assert _file_error(path) == f"{path}: twins[1]: account already used by twins[0]"


def test_duplicate_names(tmp_path: Path) -> None:
    path = _write_json(
        tmp_path / "twins.json",
        {"twins": [{**GOOD, "name": "edge"}, {"id": 2, "ip": "", "account": KEY_2.hex(), "name": "edge"}]},
    )
    assert _file_error(path) == f"{path}: twins[1]: name 'edge' already used by twins[0]"


async def test_twins_by_name() -> None:
    resolver = StaticResolver.from_twins([TWIN_1, TWIN_2, TWIN_3])
    assert await resolver.twin_id_by_name("edge-3") == 3
    assert await resolver.twin_id_by_name("edge-1") == 1
    assert await resolver.twin_id_by_name("nobody") is None


def test_from_twins_rejects_duplicates() -> None:
    with pytest.raises(TwinFileError, match="duplicate twin id 1"):
        StaticResolver.from_twins([TWIN_1, Twin(1, "", KEY_2)])


async def test_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1])
    _touch(path, 100)
    clock = Clock()
    resolver = StaticResolver(path, clock=clock)

    write_twin_file(path, [TWIN_1, TWIN_2])
    _touch(path, 200)
    with pytest.raises(TwinNotFound):
        await resolver.get_twin(2)  # checked at most once a second
    clock.now += 1.0
    assert await resolver.get_twin(2) == TWIN_2
    assert await resolver.twin_id_by_public_key(KEY_2) == 2

    write_twin_file(path, [TWIN_2])
    _touch(path, 300)
    clock.now += 1.0
    with pytest.raises(TwinNotFound):
        await resolver.get_twin(1)
    with pytest.raises(AccountNotFound):
        await resolver.twin_id_by_public_key(KEY_1)


async def test_unchanged_mtime_is_not_reread(tmp_path: Path) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1, TWIN_2])
    _touch(path, 100)
    clock = Clock()
    resolver = StaticResolver(path, clock=clock)
    size = path.stat().st_size
    write_twin_file(path, [TWIN_3, TWIN_2])
    _touch(path, 100)
    assert path.stat().st_size == size  # the premise: nothing tells the files apart
    clock.now += 5.0
    assert await resolver.get_twin(1) == TWIN_1


async def test_failed_reload_keeps_previous_twins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "twins.json"
    write_twin_file(path, [TWIN_1])
    _touch(path, 100)
    clock = Clock()
    resolver = StaticResolver(path, clock=clock)

    path.write_text('{"twins": [{"id": 2}]}')
    _touch(path, 200)
    clock.now += 1.0
    with caplog.at_level(logging.WARNING, logger="twin_resolver.static"):
        assert await resolver.get_twin(1) == TWIN_1
        clock.now += 1.0
        assert await resolver.get_twin(1) == TWIN_1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"keeping the previous 1 twins: {path}: twins[0]: missing key(s) ip, account"]

    path.unlink()
    clock.now += 1.0
    assert await resolver.get_twin(1) == TWIN_1

    write_twin_file(path, [TWIN_3])
    _touch(path, 300)
    clock.now += 1.0
    assert await resolver.get_twin(3) == TWIN_3
