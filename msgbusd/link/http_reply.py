"""What an HTTP request to another server got, or why it got nothing."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class HttpReply:
    """What an HTTP request got: the status, every header (repeated ones too) and the decoded body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        return first_header(self.headers, name)


def first_header(headers: list[tuple[str, str]], name: str) -> str | None:
    """The first value of header ``name`` (any case) among ``headers``, or None."""
    wanted = name.lower()
    return next((value for key, value in headers if key.lower() == wanted), None)


class HttpFailed(Exception):
    """An HTTP request that got no answer; ``timed_out`` tells a timeout from a connection that failed."""

    def __init__(self, reason: str, *, timed_out: bool) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


def connection_failure(exc: OSError) -> str:
    """Why a connection failed, in words: a TLS error keeps OpenSSL's text (it names the certificate
    problem), a name that does not resolve its resolver's text, any other socket error its system text
    ("connection refused")."""
    if isinstance(exc, (ssl.SSLError, socket.gaierror)) or not exc.errno:
        return str(exc) or type(exc).__name__
    text = os.strerror(exc.errno)
    return text[:1].lower() + text[1:]
