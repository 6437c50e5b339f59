"""``msgbus gateway`` as a real process in front of real sites, driven as ts-rmb-http-client drives it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from client.cli import app
from msgbusd.identity.keys import load_signer
from msgbusd.identity.signing import Signer, verify
from testing.local_sites import LocalCluster, free_port, wait_until
from tests.support.services import RawService
from twin_resolver.base import Twin
from wire import keys
from wire.envelope import Envelope, encode_payload

pytestmark = pytest.mark.timeout(60)

MSGBUS = Path(sys.executable).parent / "msgbus"
CLIENT = load_signer("bottom drive obey lake curtain smoke basket hold race lonely fit walk", "sr25519")
IMPOSTOR = load_signer("0x" + "11" * 32, "sr25519")
CLIENT_TWIN = 10
DOWN_TWIN = 3
SILENT_TWIN = 4
SERVING_TWIN = 2
MAX_BODY_BYTES = 64 * 1024
NODE_TIMEOUT_S = 1.0
READY_LINE = "msgbus gateway ready"


@dataclass
class GatewayProcess:
    """``msgbus gateway`` on a free loopback port; its log (JSON lines: not a terminal) in a file."""

    args: list[str]
    port: int = field(default_factory=free_port)
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="gateway-", suffix=".log")[1])
    )
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        command = [str(MSGBUS), "gateway", "--listen", f"127.0.0.1:{self.port}", *self.args]
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        wait_until(self._ready, 20, "the gateway to be ready")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log()}")
        return READY_LINE in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, wait; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()
        self.log_path.unlink(missing_ok=True)


class HttpBusClient:
    """Speaks to a gateway as the npm ts-rmb-http-client does: one signed ``pxy`` envelope per call, POSTed
    to ``/twin/{dst}``, then POSTs to ``/twin/{dst}/{retqueue}`` until the reply shows up."""

    def __init__(self, http: httpx.Client, twin: int, signer: Signer) -> None:
        self.http = http
        self.twin = twin
        self.signer = signer

    def envelope(self, dst: int, cmd: str, payload: str) -> Envelope:
        request = Envelope(
            cmd=cmd,
            exp=60,
            retries=2,
            dat=encode_payload(payload.encode()),
            src=self.twin,
            dst=(dst,),
            now=int(time.time()),
            pxy=True,
        )
        return self.signer.sign(request)

    def submit(self, dst: int, body: bytes) -> httpx.Response:
        # axios posts a string body as a form, which the daemon does not mind.
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        return self.http.post(f"/twin/{dst}", content=body, headers=headers)

    def send(self, dst: int, cmd: str, payload: str) -> str:
        answer = self.submit(dst, self.envelope(dst, cmd, payload).encode())
        assert answer.status_code == 200, answer.text
        retqueue = answer.json()["retqueue"]
        assert isinstance(retqueue, str)
        return retqueue

    def read(self, dst: int, retqueue: str) -> httpx.Response:
        return self.http.post(f"/twin/{dst}/{retqueue}")

    def poll(self, dst: int, retqueue: str, timeout_s: float = 15.0, every_s: float = 0.05) -> list[Envelope]:
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.read(dst, retqueue)
            assert answer.status_code == 200, answer.text
            items = answer.json()
            if items:
                return [Envelope.from_wire(item) for item in items]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply on {retqueue} within {timeout_s}s")
            time.sleep(every_s)


class SilentNode(threading.Thread):
    """A node that accepts connections, reads what it is sent and never answers; counts the connections."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="silent node")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections: list[socket.socket] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.join(timeout=5)
        for conn in self.connections:
            conn.close()


@pytest.fixture(scope="module")
def silent_node() -> Iterator[SilentNode]:
    node = SilentNode()
    node.start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def cluster(silent_node: SilentNode) -> Iterator[LocalCluster]:
    extra = [
        Twin(CLIENT_TWIN, "", CLIENT.public_key),
        Twin(DOWN_TWIN, f"127.0.0.1:{free_port()}", bytes([3]) * 32),
        Twin(SILENT_TWIN, silent_node.address, bytes([4]) * 32),
    ]
    started = LocalCluster(size=2, extra_twins=extra).start()
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture(scope="module")
def gateway(cluster: LocalCluster) -> Iterator[GatewayProcess]:
    args = ["--twins", str(cluster.twins_file), "--timeout", str(NODE_TIMEOUT_S)]
    args += ["--max-body-mib", str(MAX_BODY_BYTES / 1024 / 1024), "--drain-grace", "1"]
    process = GatewayProcess(args)
    try:
        yield process.start()
    finally:
        process.cleanup()


@pytest.fixture
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as client:
        yield client


@pytest.fixture
def bus(http: httpx.Client) -> HttpBusClient:
    return HttpBusClient(http, CLIENT_TWIN, CLIENT)


def site_redis(cluster: LocalCluster, twin: int) -> redis.Redis:
    return redis.Redis.from_url(cluster.redis[twin - 1].url)


def test_round_trip_through_the_gateway(cluster: LocalCluster, bus: HttpBusClient) -> None:
    site = cluster.sites[SERVING_TWIN - 1]
    with RawService(cluster.redis[SERVING_TWIN - 1].url, "gw.echo", handler=lambda data: data.upper()):
        retqueue = bus.send(SERVING_TWIN, "gw.echo", "hello")
        (reply,) = bus.poll(SERVING_TWIN, retqueue)
    assert (reply.dat, reply.err, reply.pxy, reply.cmd) == ("HELLO", "", True, "gw.echo")
    assert (reply.src, reply.dst) == (SERVING_TWIN, (CLIENT_TWIN,))
    verify(reply, site.public_key)
    # Results stay readable: the client may poll again.
    again = bus.read(SERVING_TWIN, retqueue)
    assert [Envelope.from_wire(item).dat for item in again.json()] == ["HELLO"]
    assert again.headers["content-type"] == "application/json"


def test_error_reply_reaches_the_client(cluster: LocalCluster, bus: HttpBusClient) -> None:
    retqueue = bus.send(SERVING_TWIN, "gw.broken", "anything")
    with site_redis(cluster, SERVING_TWIN) as conn:
        item = conn.brpop([keys.command_queue("gw.broken")], timeout=10)
        assert item is not None
        request = Envelope.decode(item[1])
        reply = request.replace(
            src=SERVING_TWIN, dst=(request.src,), dat="", err="no such thing", now=int(time.time()), sig=""
        )
        conn.lpush(keys.REPLY, reply.encode())
    (answer,) = bus.poll(SERVING_TWIN, retqueue)
    assert (answer.err, answer.dat, answer.pxy) == ("no such thing", "", True)


def test_node_refusal_becomes_a_400_with_its_message(bus: HttpBusClient) -> None:
    forged = HttpBusClient(bus.http, CLIENT_TWIN, IMPOSTOR).envelope(SERVING_TWIN, "gw.echo", "x")
    answer = bus.submit(SERVING_TWIN, forged.encode())
    assert answer.status_code == 400
    assert answer.json() == {
        "status": "error",
        "message": "failed to Submit the message: 400 Bad Request (couldn't verify signature)",
    }


def test_unsigned_message_is_refused_by_the_node(bus: HttpBusClient) -> None:
    unsigned = bus.envelope(SERVING_TWIN, "gw.echo", "x").replace(sig="")
    answer = bus.submit(SERVING_TWIN, unsigned.encode())
    assert answer.status_code == 400
    assert answer.json()["message"].startswith(
        "failed to Submit the message: 400 Bad Request (signature field"
    )


def test_node_refusal_of_a_result_query_keeps_the_proxy_wording(bus: HttpBusClient) -> None:
    answer = bus.read(SERVING_TWIN, "not-a-uuid")
    assert answer.status_code == 400
    assert answer.json() == {
        "status": "error",
        "message": "failed to send remote: 400 Bad Request (Invalid Retqueue, it should be a valid UUID)",
    }


def test_unknown_twin_is_a_404(bus: HttpBusClient) -> None:
    answer = bus.submit(99, bus.envelope(99, "gw.echo", "x").encode())
    assert answer.status_code == 404
    assert answer.json() == {"status": "error", "message": "twin 99 not found"}
    assert bus.read(99, "00000000-0000-4000-8000-000000000000").status_code == 404


def test_twin_id_that_is_not_a_number_is_a_400(http: httpx.Client) -> None:
    answer = http.post("/twin/abc", content=b"{}")
    assert answer.status_code == 400
    assert answer.json() == {"status": "error", "message": "invalid twin id 'abc'"}


def test_unreachable_node_is_a_502(bus: HttpBusClient) -> None:
    answer = bus.submit(DOWN_TWIN, bus.envelope(DOWN_TWIN, "gw.echo", "x").encode())
    assert answer.status_code == 502
    body = answer.json()
    assert body["status"] == "error"
    assert body["message"].startswith(f"cannot reach twin {DOWN_TWIN} at http://127.0.0.1:")


def test_twin_without_an_address_is_a_502(bus: HttpBusClient) -> None:
    answer = bus.read(CLIENT_TWIN, "00000000-0000-4000-8000-000000000000")
    assert answer.status_code == 502
    assert answer.json()["message"].startswith(f"twin {CLIENT_TWIN} has no address the gateway can reach")


def test_node_that_does_not_answer_is_a_504(bus: HttpBusClient, silent_node: SilentNode) -> None:
    started = time.monotonic()
    answer = bus.submit(SILENT_TWIN, bus.envelope(SILENT_TWIN, "gw.echo", "x").encode())
    assert answer.status_code == 504
    assert answer.json() == {
        "status": "error",
        "message": f"twin {SILENT_TWIN} at http://{silent_node.address}/zbus-cmd did not answer in time",
    }
    assert time.monotonic() - started < NODE_TIMEOUT_S + 2


def test_cors_preflight(http: httpx.Client) -> None:
    answer = http.options(
        f"/twin/{SERVING_TWIN}",
        headers={
            "Origin": "https://dashboard.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == "*"
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert "content-type" in answer.headers["access-control-allow-headers"].lower()


def test_cors_headers_on_answers_and_errors(cluster: LocalCluster, bus: HttpBusClient) -> None:
    origin = {"Origin": "https://dashboard.example"}
    with RawService(cluster.redis[SERVING_TWIN - 1].url, "gw.cors"):
        retqueue = bus.send(SERVING_TWIN, "gw.cors", "x")
        bus.poll(SERVING_TWIN, retqueue)
    ok = bus.http.post(f"/twin/{SERVING_TWIN}/{retqueue}", headers=origin)
    missing = bus.http.post("/twin/99", content=b"{}", headers=origin)
    assert (ok.status_code, missing.status_code) == (200, 404)
    assert ok.headers["access-control-allow-origin"] == "*"
    assert missing.headers["access-control-allow-origin"] == "*"


def test_declared_oversized_body_is_refused_before_it_is_sent(gateway: GatewayProcess) -> None:
    head = (
        f"POST /twin/{SERVING_TWIN} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {100 * MAX_BODY_BYTES}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"{")
        answer = _read_http_answer(sock)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {
        "status": "error",
        "message": f"request body larger than {MAX_BODY_BYTES} bytes",
    }


def test_streamed_oversized_body_is_refused(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b" " * (MAX_BODY_BYTES // 2)

    answer = http.post(f"/twin/{SERVING_TWIN}", content=chunks())
    assert answer.status_code == 413
    assert answer.json()["message"] == f"request body larger than {MAX_BODY_BYTES} bytes"


def test_body_at_the_limit_reaches_the_node(http: httpx.Client) -> None:
    answer = http.post(f"/twin/{SERVING_TWIN}", content=b" " * MAX_BODY_BYTES)
    assert answer.status_code == 400
    assert answer.json()["message"] == "failed to Submit the message: 400 Bad Request (couldn't parse json)"


def _read_http_answer(sock: socket.socket) -> bytes:
    """Read until the answer's body (as long as its Content-Length says) is in."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_sigterm_stops_the_gateway_cleanly_and_it_logs_json(cluster: LocalCluster) -> None:
    process = GatewayProcess(["--twins", str(cluster.twins_file)])
    try:
        process.start()
        assert process.stop() == 0
        lines = [json.loads(line) for line in process.log().splitlines()]
    finally:
        process.cleanup()
    ready = next(line for line in lines if READY_LINE in line["msg"])
    assert ready["level"] == "INFO" and ready["logger"] == "msgbusd.gateway"
    assert f"http://127.0.0.1:{process.port}" in ready["msg"] and str(cluster.twins_file) in ready["msg"]
    assert lines[-1]["msg"] == "msgbus gateway stopped"


def test_sigterm_lets_a_request_in_flight_finish(cluster: LocalCluster, silent_node: SilentNode) -> None:
    gateway = GatewayProcess(["--twins", str(cluster.twins_file), "--timeout", "2", "--drain-grace", "5"])
    answers: list[httpx.Response] = []
    try:
        gateway.start()
        before = len(silent_node.connections)
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as http:
            request = threading.Thread(target=lambda: answers.append(http.post(f"/twin/{SILENT_TWIN}")))
            request.start()
            wait_until(lambda: len(silent_node.connections) > before, what="the request to reach the node")
            assert gateway.stop() == 0
            request.join(timeout=10)
    finally:
        gateway.cleanup()
    assert [answer.status_code for answer in answers] == [504]


def test_help_names_the_loopback_default() -> None:
    result = CliRunner().invoke(app, ["gateway", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "127.0.0.1:8080" in result.output
    for option in ("--twins", "--substrate", "--listen", "--max-body-mib", "--cors-origin", "--timeout"):
        assert option in result.output


def test_no_twin_source_is_a_start_up_error() -> None:
    result = CliRunner().invoke(app, ["gateway"])
    assert result.exit_code == 2
    assert "no twin source: give a twin map (--twins FILE) or --substrate URL" in result.output


def test_unreadable_twin_map_and_port_in_use_are_start_up_errors(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    missing = subprocess.run(
        [
            str(MSGBUS),
            "gateway",
            "--twins",
            str(tmp_path / "absent.json"),
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and "absent.json" in missing.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = subprocess.run(
            [str(MSGBUS), "gateway", "--twins", str(cluster.twins_file), "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert busy.returncode == 2
    assert f"error: cannot listen on 127.0.0.1:{port}" in busy.stderr
