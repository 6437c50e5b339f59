"""TLS in front of a site, as a reverse proxy in production would: a certificate authority and a server
certificate made with openssl, and a proxy that ends TLS and forwards the bytes to the site's plain port."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from pathlib import Path

from testing.local_sites import free_port, port_open, wait_until


def make_certificates(workdir: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it, in ``workdir``: (ca, certificate, key)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True)

    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=msgbus test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "site.key", "-out", "site.csr",
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    openssl("x509", "-req", "-in", "site.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "site.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return workdir / "ca.crt", workdir / "site.crt", workdir / "site.key"


class TlsProxy:
    """Listens with TLS on 127.0.0.1:<port> and forwards each connection to ``target_port`` in plain TCP."""

    def __init__(self, target_port: int, certificate: Path, key: Path) -> None:
        self.port = free_port()
        self._target_port = target_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certificate, key)
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="tls proxy")
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        wait_until(lambda: port_open(self.port), what="the TLS proxy")

    async def _serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._forward, "127.0.0.1", self.port, ssl=self._context)

    async def _forward(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        self._writers.add(client_out)
        try:
            site_in, site_out = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            client_out.close()
            return
        self._writers.add(site_out)
        await asyncio.gather(_pipe(client_in, site_out), _pipe(site_in, client_out))

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for writer in self._writers:
                writer.close()
                with contextlib.suppress(OSError, ssl.SSLError):
                    await writer.wait_closed()
            forwarding = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in forwarding:
                task.cancel()
            await asyncio.gather(*forwarding, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
        writer.close()
