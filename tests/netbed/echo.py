"""A TCP echo server run inside a host of the bed, and the client side of the checks made through it."""

from __future__ import annotations

import select
import subprocess
import sys
import threading
import time
from socket import socket

from testing.netbed import Host

ECHO_PORT = 7000
READY_TIMEOUT_S = 10.0

# One thread per connection, echoing until the peer closes; "listening" once connections are accepted.
ECHO_SERVER = """
import socket, sys, threading
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
server = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=64)
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
"""


def start_echo_server(host: Host, port: int = ECHO_PORT) -> subprocess.Popen[bytes]:
    """An echo server in ``host`` on ``port``, returned once it listens."""
    process = host.popen([sys.executable, "-c", ECHO_SERVER, str(port)], stdout=subprocess.PIPE)
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], READY_TIMEOUT_S)
    line = process.stdout.readline() if readable else b""
    if line.strip() != b"listening":
        process.kill()
        raise RuntimeError(f"the echo server in {host.role} did not start (exit {process.wait()})")
    return process


def echoes(conn: socket, data: bytes, timeout_s: float = 5.0) -> bool:
    """Whether ``data`` sent on ``conn`` comes back whole within ``timeout_s``."""
    conn.settimeout(timeout_s)
    conn.sendall(data)
    return receive(conn, len(data), timeout_s) == data


def receive(conn: socket, size: int, timeout_s: float) -> bytes:
    """``size`` bytes from ``conn``, or fewer if it closes; raises ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    chunks = []
    got = 0
    while got < size:
        conn.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = conn.recv(min(65536, size - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def round_trip_s(client: Host, server: Host, size: int, timeout_s: float = 30.0) -> float:
    """Seconds from connecting to ``server``'s echo server to having ``size`` bytes back."""
    started = time.monotonic()
    with client.connect(server.address, ECHO_PORT, timeout_s) as conn:
        sender = threading.Thread(target=conn.sendall, args=(b"x" * size,))
        sender.start()
        try:
            assert len(receive(conn, size, timeout_s)) == size
        finally:
            sender.join(timeout_s)
    return time.monotonic() - started


def connect_s(client: Host, server: Host, timeout_s: float = 5.0) -> float:
    """Seconds ``client`` takes to open a TCP connection to ``server``'s echo server."""
    started = time.monotonic()
    with client.connect(server.address, ECHO_PORT, timeout_s):
        return time.monotonic() - started
