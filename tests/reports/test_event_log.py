"""The event log writer: lines and fields, rotation, a graceful stop writes everything."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

from msgbusd.reports.event_log import EventLog, finish_left_over
from tests.support.events import read_events
from wire import event_schema as ev
from wire.envelope import Envelope, encode_payload, payload_size


def test_a_line_has_the_site_the_event_and_the_message_fields(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 1, clock=lambda: 1700000000.123456, host="h1")
    request = Envelope(uid="", cmd="calc.add", src=1, dst=(2, 3), ret="r-1", dat=encode_payload(b"x" * 10))
    log.emit(ev.ACCEPTED, request, uid="3.7", dst=3, ret=request.ret, error=None)
    log.close()
    (line,) = read_events(tmp_path)
    assert line == {
        "ts": 1700000000123456,
        "site": 1,
        "host": "h1",
        "event": "accepted",
        "uid": "3.7",
        "cmd": "calc.add",
        "src": 1,
        "dst": 3,
        "bytes": 10,
        "ret": "r-1",
    }
    assert set(line) <= set(ev.EVENT_FIELDS)


def test_disabled_writes_nothing(tmp_path: Path) -> None:
    log = EventLog(None, 1)
    log.emit(ev.ACCEPTED, Envelope())
    log.close()
    assert not log.enabled and log.written == 0
    assert list(tmp_path.iterdir()) == []


def test_a_full_file_is_closed_and_the_next_one_started(tmp_path: Path) -> None:
    now = [1700000000.0]
    log = EventLog(tmp_path, 4, max_bytes=300, rotate_s=60, clock=lambda: now[0], host="h")
    for round_ in range(4):
        for index in range(3):
            log.emit(ev.SENT, Envelope(uid=f"2.{round_}{index}", cmd="c", src=4, dst=(2,)), attempt=1)
        log.close()
        now[0] += 0.001
    files = sorted(tmp_path.glob("events-4-*.jsonl"))
    assert len(files) >= 2
    assert [line["uid"] for line in read_events(tmp_path)] == [
        f"2.{r}{i}" for r in range(4) for i in range(3)
    ]


def test_an_old_file_is_closed_after_its_time(tmp_path: Path) -> None:
    now = [1700000000.0]
    log = EventLog(tmp_path, 4, rotate_s=60, clock=lambda: now[0], host="h")
    log.emit(ev.SENT, Envelope(uid="2.1"))
    log._write(log._take())
    now[0] += 61
    log.emit(ev.SENT, Envelope(uid="2.2"))
    log.close()
    files = sorted(tmp_path.glob("events-4-*.jsonl"))
    assert [[json.loads(line)["uid"] for line in f.read_text().splitlines()] for f in files] == [
        ["2.1"],
        ["2.2"],
    ]


async def test_the_background_writer_flushes_and_a_stop_writes_the_rest(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 1, host="h")
    stopping = asyncio.Event()
    writer = asyncio.create_task(log.run(stopping))
    log.emit(ev.RECEIVED, Envelope(uid="1.1"))
    for _ in range(100):
        if log.written:
            break
        await asyncio.sleep(0.05)
    assert log.written == 1, "written within a few flush intervals"
    log.emit(ev.REPLY_TAKEN, Envelope(uid="1.1"))
    stopping.set()
    await writer
    log.close()
    assert [line["event"] for line in read_events(tmp_path)] == ["received", "reply_taken"]


def test_a_file_is_writing_until_it_is_complete_then_named(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 4, host="h")
    log.emit(ev.SENT, Envelope(uid="2.1"))
    log._write(log._take())
    [writing] = tmp_path.iterdir()
    assert writing.name.startswith("events-4-") and writing.name.endswith(".jsonl.writing")
    assert list(tmp_path.glob("*.jsonl")) == []
    log.close()
    assert [path.name for path in tmp_path.iterdir()] == [writing.name.removesuffix(".writing")]
    assert [line["uid"] for line in read_events(tmp_path)] == ["2.1"]


def files(directory: Path, pattern: str) -> list[Path]:
    return list(directory.glob(pattern))


async def test_a_file_is_completed_when_due_also_without_new_events(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 4, rotate_s=1.0, host="h")
    stopping = asyncio.Event()
    writer = asyncio.create_task(log.run(stopping))
    log.emit(ev.SENT, Envelope(uid="2.1"))
    try:
        for _ in range(100):
            if files(tmp_path, "events-4-*.jsonl"):
                break
            await asyncio.sleep(0.05)
        assert [line["uid"] for line in read_events(tmp_path)] == ["2.1"], "named within a few intervals"
        assert files(tmp_path, "*.writing") == [], "no file is started before there is something to write"
    finally:
        stopping.set()
        await writer
        log.close()


def test_a_file_left_by_a_killed_writer_is_cut_after_its_last_line_and_named(tmp_path: Path) -> None:
    (tmp_path / "events-9-A.jsonl.writing").write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    (tmp_path / "events-9-B.jsonl.writing").write_bytes(b'{"unfinished": ')
    (tmp_path / "events-9-C.jsonl.writing").write_bytes(b"")
    EventLog(tmp_path, 1, host="h")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["events-9-A.jsonl"]
    assert (tmp_path / "events-9-A.jsonl").read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def test_a_file_still_being_written_is_left_alone(tmp_path: Path) -> None:
    writing = EventLog(tmp_path, 4, host="h")
    writing.emit(ev.SENT, Envelope(uid="2.1"))
    writing._write(writing._take())
    assert finish_left_over(tmp_path) == 0
    assert list(tmp_path.glob("events-*.jsonl")) == []
    writing.emit(ev.SENT, Envelope(uid="2.2"))
    writing.close()
    assert [line["uid"] for line in read_events(tmp_path)] == ["2.1", "2.2"]


def test_payload_size_matches_the_decoded_payload() -> None:
    for size in range(0, 70):
        data = (b"abc" * 30)[:size]
        assert payload_size(base64.b64encode(data).decode()) == size
