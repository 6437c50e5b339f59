"""configure_logging: JSON lines off a terminal, plain lines on one, quiet libraries, idempotent."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from msgbusd.reports.logs import NOISY_LOGGERS, configure_logging, flush_logs


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def lines(stream: io.StringIO) -> list[str]:
    flush_logs()
    return stream.getvalue().splitlines()


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines(stream)]


def test_json_line_has_the_fields() -> None:
    stream = io.StringIO()
    configure_logging(logging.INFO, stream=stream)
    before = datetime.now(UTC)
    logging.getLogger("msgbusd.test").info("sent %s to twin %d", "abc", 7)
    after = datetime.now(UTC)

    [record] = records(stream)
    assert set(record) == {"ts", "level", "logger", "msg"}
    assert record["level"] == "INFO"
    assert record["logger"] == "msgbusd.test"
    assert record["msg"] == "sent abc to twin 7"
    ts = str(record["ts"])
    assert ts.endswith("Z")
    assert len(ts.rsplit(".", 1)[1]) == len("123456Z"), "microseconds"
    parsed = datetime.fromisoformat(ts)
    assert parsed.utcoffset() == timedelta(0)
    assert before - timedelta(milliseconds=1) <= parsed <= after + timedelta(milliseconds=1)


def test_context_fields_from_extra() -> None:
    stream = io.StringIO()
    configure_logging(logging.INFO, stream=stream)
    log = logging.getLogger("msgbusd.test")
    log.warning(
        "refused",
        extra={"uid": "9.41", "queue": "msgbus.system.local", "twin": 9, "cmd": "calc.add", "other": "x"},
    )
    log.warning("only some", extra={"twin": 3})

    first, second = records(stream)
    assert first["uid"] == "9.41"
    assert first["queue"] == "msgbus.system.local"
    assert first["twin"] == 9
    assert first["cmd"] == "calc.add"
    assert "other" not in first
    assert second["twin"] == 3
    assert not {"uid", "queue", "cmd"} & set(second)


def test_exception_traceback() -> None:
    stream = io.StringIO()
    configure_logging(logging.INFO, stream=stream)
    try:
        raise RuntimeError("the bad thing")
    except RuntimeError:
        logging.getLogger("msgbusd").exception("handling failed", extra={"uid": "1.2"})

    [record] = records(stream)
    assert record["level"] == "ERROR"
    assert record["msg"] == "handling failed"
    assert record["uid"] == "1.2"
    exc = str(record["exc"])
    assert exc.startswith("Traceback (most recent call last):")
    assert "RuntimeError: the bad thing" in exc
    assert len(lines(stream)) == 1, "the traceback stays inside one JSON line"


def test_plain_format_when_asked() -> None:
    stream = io.StringIO()
    configure_logging(logging.INFO, json_format=False, stream=stream)
    logging.getLogger("msgbusd.test").warning("twin %d is back", 4, extra={"twin": 4})

    [line] = lines(stream)
    assert line.endswith(" WARNING msgbusd.test: twin 4 is back")
    datetime.strptime(line[: len("2024-01-01 00:00:00")], "%Y-%m-%d %H:%M:%S")


def test_auto_format_follows_the_terminal() -> None:
    terminal = FakeTerminal()
    configure_logging(logging.INFO, stream=terminal)
    logging.getLogger("msgbusd").info("hello")
    assert lines(terminal)[0].endswith(" INFO msgbusd: hello")

    pipe = io.StringIO()
    configure_logging(logging.INFO, stream=pipe)
    logging.getLogger("msgbusd").info("hello")
    assert records(pipe)[0]["msg"] == "hello"


def test_json_forced_on_a_terminal() -> None:
    terminal = FakeTerminal()
    configure_logging(logging.INFO, json_format=True, stream=terminal)
    logging.getLogger("msgbusd").info("hello")
    assert records(terminal)[0]["msg"] == "hello"


def test_level_filters() -> None:
    stream = io.StringIO()
    configure_logging(logging.WARNING, stream=stream)
    log = logging.getLogger("msgbusd.test")
    log.info("hidden")
    log.debug("hidden")
    log.error("shown")
    assert [r["msg"] for r in records(stream)] == ["shown"]


@pytest.mark.parametrize(
    ("level", "expected"),
    [(logging.DEBUG, logging.WARNING), (logging.INFO, logging.WARNING), (logging.ERROR, logging.ERROR)],
)
def test_noisy_libraries_are_quieted(level: int, expected: int) -> None:
    stream = io.StringIO()
    configure_logging(level, stream=stream)
    for name in ("httpx", "httpcore", "redis", "asyncio", "uvicorn"):
        assert logging.getLogger(name).level == expected
    logging.getLogger("httpx").info("HTTP Request: POST http://peer/zbus-remote")
    logging.getLogger("asyncio").info("Using selector: EpollSelector")
    assert lines(stream) == []


def test_idempotent() -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    first = io.StringIO()
    configure_logging(logging.INFO, stream=first)
    configure_logging(logging.INFO, stream=first)
    assert len(root.handlers) == before + 1
    logging.getLogger("msgbusd").info("once")
    assert len(lines(first)) == 1

    # A later call replaces the earlier handler: output moves to the new stream and format.
    second = io.StringIO()
    configure_logging(logging.DEBUG, json_format=False, stream=second)
    assert len(root.handlers) == before + 1
    logging.getLogger("msgbusd").debug("moved")
    assert len(lines(first)) == 1
    assert lines(second)[0].endswith(" DEBUG msgbusd: moved")


def test_other_handlers_are_kept() -> None:
    root = logging.getLogger()
    theirs = logging.StreamHandler(io.StringIO())
    root.addHandler(theirs)
    configure_logging(logging.INFO, stream=io.StringIO())
    configure_logging(logging.INFO, stream=io.StringIO())
    assert theirs in root.handlers


class HeldStream(io.StringIO):
    """A stream whose writes wait until it is let go, as journald's socket does while journald catches up."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.let_go = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        self.let_go.wait(10)
        return super().write(text)


def test_a_slow_stream_does_not_hold_up_the_caller_and_lines_beyond_the_queue_are_counted() -> None:
    stream = HeldStream()
    configure_logging(logging.INFO, stream=stream, queued_records=5)
    log = logging.getLogger("msgbusd.test")
    log.info("line 0")
    assert stream.writing.wait(10), "the writer took the first line"
    started = time.monotonic()
    for n in range(1, 20):
        log.info("line %d", n)
    took_s = time.monotonic() - started
    stream.let_go.set()
    written = [record["msg"] for record in records(stream)]
    # The first line waits in the writer, five in the queue; the others are dropped, and said so once the
    # writer caught up.
    assert written == [
        *(f"line {n}" for n in range(6)),
        "14 log line(s) dropped: the log stream did not take them fast enough",
    ]
    assert took_s < 5, "the calls did not wait for the stream"
