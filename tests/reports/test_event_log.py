"""The event log writer: lines and fields, rotation, a graceful stop writes everything; writing that fails
drops and counts events, says so, and resumes by itself."""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from msgbusd.reports.event_log import EventLog, finish_left_over
from msgbusd.reports.event_log_drops import clock_time, drop_reason
from msgbusd.reports.metrics import EVENT_LOG_DROPS, Metrics
from tests.reports.event_log_disk import fill, remount, small_disk
from tests.support.events import read_events
from tests.support.metrics import samples
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
    log = EventLog(tmp_path, 1, host="h", flush_interval_s=0.05)
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
    log = EventLog(tmp_path, 4, rotate_s=0.2, host="h", flush_interval_s=0.05)
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


# Writing that fails: the events are dropped and counted, the bus is told, and writing resumes by itself.

T0 = 1700000000.0
DROPS_LOGGER = "msgbusd.reports.event_log_drops"


def sent(log: EventLog, *uids: str) -> None:
    for uid in uids:
        log.emit(ev.SENT, Envelope(uid=uid, cmd="c", src=4, dst=(2,)), attempt=1)


def completed_uids(directory: Path) -> list[list[str]]:
    """The uids in each completed file, each file checked to end with a whole line."""
    found = []
    for path in sorted(directory.glob("events-*.jsonl")):
        text = path.read_text()
        assert text.endswith("\n"), f"{path.name} ends in the middle of a line"
        found.append([json.loads(line)["uid"] for line in text.splitlines()])
    return found


def dropped_metric(metrics: Metrics) -> dict[str, float]:
    found = samples(metrics.render()[0].decode())
    prefix = 'msgbus_event_log_dropped_total{reason="'
    return {name.removeprefix(prefix)[:-2]: value for name, value in found.items() if name.startswith(prefix)}


def test_a_file_removed_with_its_directory_is_counted_as_lost_and_writing_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events, now = tmp_path / "events", [T0]
    log = EventLog(events, 4, clock=lambda: now[0], host="h")
    sent(log, "2.1", "2.2")
    log.flush()
    [removed] = events.glob("*.writing")
    shutil.rmtree(events)
    now[0] += 1
    sent(log, "2.3")
    with caplog.at_level(logging.WARNING, logger=DROPS_LOGGER):
        log.flush()
    assert log.drops.by_reason == {"missing": 2}, "what went into the removed file is lost"
    assert log.drops.warnings() == [], "written again at once: the directory is made again"
    assert caplog.messages == [
        f"the event log in {events} could not be written (No such file or directory: {removed.name} was "
        f"removed while it was written): 2 event(s) dropped since {clock_time(T0 + 1)}; it is written again"
    ]
    log.close()
    assert completed_uids(events) == [["2.3"]]


def test_a_file_where_the_directory_should_be_drops_and_counts_until_it_is_gone(tmp_path: Path) -> None:
    path, now, metrics = tmp_path / "events", [T0], Metrics()
    path.write_text("not a directory\n")
    log = EventLog(path, 4, clock=lambda: now[0], host="h", metrics=metrics)
    assert log.drops.warnings() == [
        f"the event log in {path} cannot be written (Not a directory): 0 event(s) dropped since "
        f"{clock_time(T0)}; messages are carried as usual; it writes again once it can"
    ]
    for second in range(1, 4):
        now[0] = T0 + second
        sent(log, f"2.{second}")
        log.flush()
    assert log.drops.by_reason == {"not_a_directory": 3}
    assert dropped_metric(metrics) == dict.fromkeys(EVENT_LOG_DROPS, 0.0) | {"not_a_directory": 3.0}
    assert "(Not a directory): 3 event(s) dropped since" in log.drops.warnings()[0]

    path.unlink()
    now[0] += 1
    sent(log, "2.9")
    log.flush()
    assert log.drops.warnings() == []
    assert dropped_metric(metrics)["not_a_directory"] == 3.0, "the count stays"
    log.close()
    assert completed_uids(path) == [["2.9"]]


def test_the_warning_is_logged_at_most_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, now = tmp_path / "events", [T0]
    path.write_text("")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == DROPS_LOGGER and r.levelname == "WARNING"]

    with caplog.at_level(logging.INFO, logger=DROPS_LOGGER):
        log = EventLog(path, 4, clock=lambda: now[0], host="h")
        assert warnings() == [
            f"the event log in {path} cannot be written (Not a directory): 0 event(s) dropped since "
            f"{clock_time(T0)}; messages are carried as usual; it writes again once it can"
        ]
        for second in range(1, 60):
            now[0] = T0 + second
            sent(log, f"2.{second}", f"3.{second}")
            log.flush()
        assert len(warnings()) == 1, "not again within the minute"
        now[0] = T0 + 60
        log.flush()
        assert warnings()[1] == (
            f"the event log in {path} cannot be written (Not a directory): 118 event(s) dropped since "
            f"{clock_time(T0 + 1)}; messages are carried as usual; it writes again once it can"
        )
        now[0] = T0 + 61
        sent(log, "2.61")
        log.flush()
        path.unlink()
        now[0] = T0 + 62
        sent(log, "2.62")
        log.flush()
        assert len(warnings()) == 2, "the drop after the last warning waits for the minute"
        now[0] = T0 + 120
        log.flush()
        assert warnings()[2] == (
            f"the event log in {path} could not be written (Not a directory): 1 event(s) dropped since "
            f"{clock_time(T0 + 61)}; it is written again"
        )
        log.close()
    assert log.drops.by_reason == {"not_a_directory": 119}
    assert completed_uids(path) == [["2.62"]]


def test_what_no_warning_told_yet_is_logged_when_the_log_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, now = tmp_path / "events", [T0]
    path.write_text("")
    with caplog.at_level(logging.WARNING, logger=DROPS_LOGGER):
        log = EventLog(path, 4, clock=lambda: now[0], host="h")
        now[0] += 5
        sent(log, "2.1", "2.2")
        log.close()
    assert [r.getMessage() for r in caplog.records if r.name == DROPS_LOGGER][1].startswith(
        f"the event log in {path} cannot be written (Not a directory): 2 event(s) dropped since"
    )


def test_events_beyond_what_may_wait_are_dropped_not_held(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 4, max_pending=3, host="h")
    sent(log, "2.1", "2.2", "2.3", "2.4", "2.5")
    assert log.drops.by_reason == {"behind": 2}
    assert "(events come faster than they are written): 2 event(s) dropped" in log.drops.warnings()[0]
    log.flush()
    assert log.drops.warnings() == []
    log.close()
    assert completed_uids(tmp_path) == [["2.1", "2.2", "2.3"]]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "no_space"),
        (errno.EDQUOT, "no_space"),
        (errno.EROFS, "read_only"),
        (errno.EACCES, "permission"),
        (errno.EPERM, "permission"),
        (errno.ENOENT, "missing"),
        (errno.ENOTDIR, "not_a_directory"),
        (errno.EIO, "io_error"),
        (errno.EMFILE, "other"),
    ],
)
def test_the_reason_comes_from_the_errno(code: int, reason: str) -> None:
    assert drop_reason(OSError(code, os.strerror(code))) == reason


async def test_the_background_writer_goes_on_through_failures(tmp_path: Path) -> None:
    path = tmp_path / "events"
    path.write_text("")
    log = EventLog(path, 4, host="h", flush_interval_s=0.01)
    stopping = asyncio.Event()
    writer = asyncio.create_task(log.run(stopping))
    try:
        sent(log, "2.1")
        for _ in range(500):
            if log.drops.by_reason:
                break
            await asyncio.sleep(0.01)
        assert log.drops.by_reason == {"not_a_directory": 1}, "dropped within a few flush intervals"
        path.unlink()
        sent(log, "2.2")
        for _ in range(500):
            if log.written:
                break
            await asyncio.sleep(0.01)
        assert not writer.done() and log.written == 1, "written again within a few flush intervals"
    finally:
        stopping.set()
        await writer
        log.close()
    assert completed_uids(path) == [["2.2"]]


async def test_an_event_the_writer_cannot_encode_is_dropped_and_the_writer_goes_on(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 4, host="h", flush_interval_s=0.01)
    stopping = asyncio.Event()
    writer = asyncio.create_task(log.run(stopping))
    try:
        log.emit("sent", odd=object())
        for _ in range(500):
            if log.drops.by_reason:
                break
            await asyncio.sleep(0.01)
        assert log.drops.by_reason == {"other": 1}
        sent(log, "2.3")
        for _ in range(500):
            if log.written:
                break
            await asyncio.sleep(0.01)
        assert not writer.done() and log.written == 1
    finally:
        stopping.set()
        await writer
        log.close()
    assert completed_uids(tmp_path) == [["2.3"]]


def test_a_full_disk_drops_and_cuts_the_file_after_its_last_line_then_writing_resumes_in_a_new_file(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", 128) as disk:
        now, metrics = [T0], Metrics()
        log = EventLog(disk, 4, clock=lambda: now[0], host="h", metrics=metrics)
        before = [f"2.{n}" for n in range(10)]
        sent(log, *before)
        log.flush()
        # Room for a page more: the next batch, larger, is written in part, then the disk is full.
        filler = fill(disk, leave_bytes=4096)
        now[0] += 1
        sent(log, *(f"3.{n}" for n in range(200)))
        log.flush()
        assert log.drops.by_reason == {"no_space": 200}
        assert list(disk.glob("*.writing")) == [], "the file that failed is complete"
        assert completed_uids(disk) == [before], "cut after its last whole line"
        # A new file is started for the next batch; cut back to nothing, it is removed.
        now[0] += 1
        sent(log, *(f"3.{n}" for n in range(200, 400)))
        log.flush()
        assert log.drops.by_reason == {"no_space": 400}
        assert dropped_metric(metrics)["no_space"] == 400
        assert completed_uids(disk) == [before] and list(disk.glob("*.writing")) == []
        [warning] = log.drops.warnings()
        assert warning == (
            f"the event log in {disk} cannot be written (No space left on device): 400 event(s) dropped "
            f"since {clock_time(T0 + 1)}; messages are carried as usual; it writes again once it can"
        )

        filler.unlink()
        now[0] += 1
        sent(log, "4.1", "4.2")
        log.flush()
        assert log.drops.warnings() == []
        log.close()
        assert completed_uids(disk) == [before, ["4.1", "4.2"]]


def test_a_read_only_file_system_at_start_drops_until_it_can_be_written(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 64, read_only=True) as disk:
        events, now = disk / "events", [T0]
        log = EventLog(events, 4, clock=lambda: now[0], host="h")
        assert "cannot be written (Read-only file system)" in log.drops.warnings()[0]
        sent(log, "2.1")
        log.flush()
        assert log.drops.by_reason == {"read_only": 1}
        remount(disk, read_only=False)
        now[0] += 1
        sent(log, "2.2")
        log.flush()
        assert log.drops.warnings() == []
        log.close()
        assert completed_uids(events) == [["2.2"]]
