"""One HTTP request on a connection of its own, closed once it is answered.

A lone message to a twin that is not busy goes this way, and so does a probe of a site that is down: a
connection that would not be used again. On loopback such a request costs 0.16-0.20 ms of CPU here, against
0.59-0.69 ms through aiohttp with ``Connection: close`` (its session, connector, URL and timer machinery are
made for connections that are kept); at 10,000 twins sent one message each that was a fifth of the daemon's
CPU. The answer is read with httptools, the parser uvicorn uses.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

import httptools

from msgbusd.link.http_reply import HttpFailed, HttpReply, connection_failure, first_header


class OneShotRequests:
    """Requests each on a connection opened for it and closed once it is answered (``https`` URLs with the
    system's certificate authorities, or ``SSL_CERT_FILE``'s, as aiohttp does)."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None

    def _tls_context(self) -> ssl.SSLContext:
        # Made at the first https request: it reads the certificate authorities from disk.
        if self._tls is None:
            self._tls = ssl.create_default_context()
            self._tls.set_alpn_protocols(("http/1.1",))
        return self._tls

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[str, str]],
        content: bytes,
        timeout_s: float,
    ) -> HttpReply:
        """Make one request; raises :class:`HttpFailed` when no answer came within ``timeout_s``."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpFailed(f"not an http(s) URL: {url!r}", timed_out=False)
        secure = parts.scheme == "https"
        try:
            port = parts.port or (443 if secure else 80)
        except ValueError as exc:
            raise HttpFailed(f"bad port in {url!r}", timed_out=False) from exc
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in headers if name.lower() != "connection"]
        lines += [f"Content-Length: {len(content)}", "Connection: close", "", ""]
        message = "\r\n".join(lines).encode("latin-1") + content

        loop = asyncio.get_running_loop()
        exchange = _Exchange(loop.create_future())
        transport: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(timeout_s):
                transport, _ = await loop.create_connection(
                    lambda: exchange,
                    parts.hostname,
                    port,
                    ssl=self._tls_context() if secure else None,
                    server_hostname=parts.hostname if secure else None,
                )
                transport.write(message)
                return await exchange.answer
        except TimeoutError:
            raise HttpFailed(f"no answer within {timeout_s:g}s", timed_out=True) from None
        except OSError as exc:
            raise HttpFailed(connection_failure(exc), timed_out=False) from None
        finally:
            exchange.answer.cancel()  # no effect once answered; else nothing is set on it any more
            if transport is not None:
                transport.close()
            exchange.release()


class _Exchange(asyncio.Protocol):
    """The client side of one request: parses the answer and resolves :attr:`answer` with it."""

    def __init__(self, answer: asyncio.Future[HttpReply]) -> None:
        self.answer = answer
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._transport: asyncio.BaseTransport | None = None
        self._status = 0
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._headers_read = False

    def release(self) -> None:
        """Let go of the parser and the transport, which both refer back to this exchange: without these
        cycles the exchange is freed as soon as it is done with, not by the cyclic garbage collector."""
        self._parser = None
        self._transport = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self.answer.done() or self._parser is None:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"unreadable answer: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer.done():
            return
        if (
            self._headers_read
            and first_header(self._headers, "content-length") is None
            and not self._chunked()
        ):
            # An answer with neither a length nor chunks ends where the connection does.
            self._answered()
        elif self._headers_read:
            self._fail("the connection closed in the middle of the answer")
        else:
            self._fail(f"the server closed the connection without answering{f' ({exc})' if exc else ''}")

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # called by the parser itself
        self._status = self._parser.get_status_code()
        self._headers_read = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._status < 200:  # an interim answer (100 Continue): the real one follows
            self._headers, self._body, self._headers_read = [], [], False
            return
        self._answered()

    def _answered(self) -> None:
        if not self.answer.done():
            self.answer.set_result(HttpReply(self._status, self._headers, b"".join(self._body)))
        if self._transport is not None:
            self._transport.close()

    def _fail(self, reason: str) -> None:
        if not self.answer.done():
            self.answer.set_exception(OSError(reason))
        if self._transport is not None:
            self._transport.close()

    def _chunked(self) -> bool:
        return "chunked" in (first_header(self._headers, "transfer-encoding") or "").lower()
