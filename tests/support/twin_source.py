"""A real HTTP twin source (``GET /twin/{id}``) over a twin map, which a test can take down."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from testing.local_sites import free_port
from twin_resolver.static import load_twin_file


class TwinSource:
    def __init__(self, twins_file: Path) -> None:
        self.twins_file = twins_file
        self.port = free_port()
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TwinSource:
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                source.requests += 1
                head, _, twin_id = self.path.rpartition("/")
                twins = load_twin_file(source.twins_file)
                twin = twins.get(int(twin_id)) if head == "/twin" and twin_id.isdigit() else None
                if twin is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(
                    {"version": 1, "id": twin.id, "account": "0x" + twin.public_key.hex(), "ip": twin.address}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
