"""A request on a connection of its own: what is sent, every way an answer can be framed, and every way
one can fail to come, against real servers on loopback."""

from __future__ import annotations

import asyncio
import gc
import inspect
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvloop

from msgbusd.link.http_client import HttpClients
from msgbusd.link.http_reply import HttpFailed, HttpReply
from msgbusd.link.one_shot import OneShotRequests, _Exchange
from tests.support.servers import free_port
from tests.support.tls import make_certificates

BODY = b'{"ver": 1}'

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def on_both_loops(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on asyncio's own loop and on uvloop's, the daemon's (whose transports are not
    asyncio's classes)."""

    def run(loop: str, *args: Any, **kwargs: Any) -> None:
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            runner.run(test(*args, **kwargs))

    signature = inspect.signature(test)
    loop_parameter = inspect.Parameter("loop", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[loop_parameter, *signature.parameters.values()]
    )
    run.__name__, run.__doc__ = test.__name__, test.__doc__
    return pytest.mark.parametrize("loop", list(LOOPS))(run)


class CannedServer:
    """Answers every request with ``answer`` (raw bytes, written in ``pieces`` parts), then closes unless
    ``keep_open``; records each request as it arrived."""

    def __init__(self, answer: bytes, *, pieces: int = 1, keep_open: bool = False) -> None:
        self.answer = answer
        self.pieces = pieces
        self.keep_open = keep_open
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        self.requests.append(head + await reader.readexactly(length))
        step = max(1, len(self.answer) // self.pieces)
        for start in range(0, len(self.answer), step):
            writer.write(self.answer[start : start + step])
            await writer.drain()
            await asyncio.sleep(0.01)
        if self.keep_open:
            await reader.read()  # returns once the client has closed
            self.closed_by_client.set()
        writer.close()


@asynccontextmanager
async def serving(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object],
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[int]:
    port = free_port()
    handling: set[asyncio.Task[object]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handling.add(task)
        await handler(reader, writer)  # type: ignore[misc]

    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=tls)
    async with server:
        yield port
    # What the server still writes after the client has what it needs ends before the test does.
    await asyncio.wait_for(asyncio.gather(*handling, return_exceptions=True), 5)


@on_both_loops
async def test_a_request_names_its_host_length_and_closing_and_reads_a_sized_answer() -> None:
    server = CannedServer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Kind: a\r\nX-Kind: b\r\n\r\nhello")
    async with serving(server.handle) as port:
        reply = await OneShotRequests().request(
            "POST",
            f"http://127.0.0.1:{port}/zbus-remote?x=1",
            headers=[("content-type", "application/json"), ("connection", "keep-alive")],
            content=BODY,
            timeout_s=5,
        )
    assert (reply.status, reply.body) == (200, b"hello")
    assert [value for name, value in reply.headers if name == "X-Kind"] == ["a", "b"]
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /zbus-remote?x=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}" in lines
    assert "content-type: application/json" in lines
    assert f"Content-Length: {len(BODY)}" in lines
    # The caller's own Connection header is replaced: this connection is never kept.
    assert [line for line in lines if line.lower().startswith("connection")] == ["Connection: close"]
    assert body == BODY


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nbad r\r\n6\r\nequest\r\n0\r\n\r\n",
        # Neither a length nor chunks: the answer ends with the connection.
        b"HTTP/1.1 400 Bad Request\r\n\r\nbad request",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request",
    ],
    ids=["chunked", "until-closed", "after-100-continue"],
)
@on_both_loops
async def test_every_framing_of_an_answer_is_read_whole_even_in_pieces(answer: bytes) -> None:
    server = CannedServer(answer, pieces=4)
    async with serving(server.handle) as port:
        reply = await OneShotRequests().request(
            "POST", f"http://127.0.0.1:{port}/x", headers=(), content=BODY, timeout_s=5
        )
    assert (reply.status, reply.body) == (400, b"bad request")


@on_both_loops
async def test_the_connection_is_closed_once_answered_even_when_the_server_would_keep_it() -> None:
    server = CannedServer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", keep_open=True)
    async with serving(server.handle) as port:
        reply = await OneShotRequests().request(
            "POST", f"http://127.0.0.1:{port}/x", headers=(), content=BODY, timeout_s=5
        )
        assert reply.status == 200
        await asyncio.wait_for(server.closed_by_client.wait(), 5)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"", "the server closed the connection without answering"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort",
            "the connection closed in the middle of the answer",
        ),
        (b"NOT HTTP AT ALL\r\n\r\n", "unreadable answer"),
    ],
    ids=["nothing", "cut-short", "not-http"],
)
@on_both_loops
async def test_an_answer_that_does_not_come_whole_is_a_failure_that_says_so(
    answer: bytes, reason: str
) -> None:
    server = CannedServer(answer)
    async with serving(server.handle) as port:
        with pytest.raises(HttpFailed) as failed:
            await OneShotRequests().request(
                "POST", f"http://127.0.0.1:{port}/x", headers=(), content=BODY, timeout_s=5
            )
    assert str(failed.value).startswith(reason)
    assert not failed.value.timed_out


@on_both_loops
async def test_a_refused_connection_and_a_silent_server_fail_with_their_reasons() -> None:
    with pytest.raises(HttpFailed) as refused:
        await OneShotRequests().request(
            "POST", f"http://127.0.0.1:{free_port()}/x", headers=(), content=BODY, timeout_s=5
        )
    assert (str(refused.value), refused.value.timed_out) == ("connection refused", False)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async with serving(silent) as port:
        with pytest.raises(HttpFailed) as late:
            await OneShotRequests().request(
                "POST", f"http://127.0.0.1:{port}/x", headers=(), content=BODY, timeout_s=0.3
            )
    assert (str(late.value), late.value.timed_out) == ("no answer within 0.3s", True)


@on_both_loops
async def test_an_unusable_url_is_a_failure_not_a_crash() -> None:
    for url in ("ftp://127.0.0.1/x", "http:///x", "http://127.0.0.1:99999/x"):
        with pytest.raises(HttpFailed):
            await OneShotRequests().request("POST", url, headers=(), content=BODY, timeout_s=1)


@on_both_loops
async def test_https_checks_the_certificate_against_the_trusted_authorities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, certificate, key = make_certificates(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certificate, key)
    server = CannedServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with serving(server.handle, tls) as port:
        url = f"https://127.0.0.1:{port}/x"
        with pytest.raises(HttpFailed) as untrusted:
            await OneShotRequests().request("POST", url, headers=(), content=BODY, timeout_s=5)
        assert "certificate verify failed" in str(untrusted.value)
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        reply = await OneShotRequests().request("POST", url, headers=(), content=BODY, timeout_s=5)
    assert (reply.status, reply.body) == (200, b"ok")
    assert server.requests[0].startswith(b"POST /x HTTP/1.1\r\n")


@on_both_loops
async def test_a_refused_connection_reads_the_same_whether_the_connection_was_to_be_kept_or_not() -> None:
    http = HttpClients(5)
    url = f"http://127.0.0.1:{free_port()}/x"
    try:
        for keep_alive in (True, False):
            with pytest.raises(HttpFailed) as refused:
                await http.request("POST", url, content=BODY, keep_alive=keep_alive)
            assert str(refused.value) == "connection refused", keep_alive
    finally:
        await http.aclose()


@on_both_loops
async def test_a_finished_request_leaves_nothing_to_the_cyclic_garbage_collector() -> None:
    """What a request made is freed as soon as it is done with: objects left in reference cycles wait for the
    collector, whose passes came ever more often with thousands of requests."""
    server = CannedServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    requests = OneShotRequests()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        async with serving(server.handle) as port:
            for _ in range(5):
                reply = await requests.request(
                    "POST", f"http://127.0.0.1:{port}/x", headers=(), content=BODY, timeout_s=5
                )
                assert reply.body == b"ok"
        with pytest.raises(HttpFailed):
            await requests.request(
                "POST", f"http://127.0.0.1:{free_port()}/x", headers=(), content=BODY, timeout_s=5
            )
        gc.collect()
        left = [
            type(o).__name__
            for o in gc.garbage
            if isinstance(o, _Exchange | httptools.HttpResponseParser | HttpReply)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
