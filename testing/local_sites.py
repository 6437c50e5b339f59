"""Real msgbus sites on one machine: private redis-server and msgbusd processes on free loopback ports.

Used by ``msgbus demo``, the benchmark and the tests. Everything waits on conditions (a port accepting
connections, the daemon's ready line), never on fixed sleeps, and cleans up after itself.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis

from msgbusd.identity.keys import load_signer, new_mnemonic
from twin_resolver.base import Twin
from twin_resolver.static import write_twin_file

READY_LINE = "msgbusd ready"
# How long a site may take to start. A process of low priority (`make test` runs some tests at nice 19
# beside the fault phase) gets a core only when nothing else wants it: its sites may need minutes to
# import and start, not seconds.
SITE_START_S = 20.0 if os.nice(0) < 10 else 180.0


# Where Debian's faketime package puts libfaketime.
LIBFAKETIME = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")

# Ports free_port gave out in this process: one chosen for a server that has not started yet is free too.
_HANDED_OUT: set[int] = set()


def free_port(count: int = 1) -> int:
    """A loopback port nothing listens on (the first of ``count`` in a row), below the kernel's ephemeral
    range: a port the kernel handed out would be free now, but any outgoing connection (to Redis, to a peer)
    may take it as its source port before the server that was meant to listen there starts. Never the same
    port twice in one process."""
    low, high = _port_range()
    for _ in range(1000):
        first = random.randrange(low, high - count + 1)
        ports = range(first, first + count)
        if _HANDED_OUT.intersection(ports) or not all(map(_bindable, ports)):
            continue
        _HANDED_OUT.update(ports)
        return first
    raise RuntimeError(f"no {count} free port(s) in a row found between {low} and {high}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_range() -> tuple[int, int]:
    """Ports 10000 up to the ephemeral range; under pytest-xdist, this worker's share of them, so that a port
    one worker's test left free for a moment (a server it restarts) is never picked by another."""
    low, high = 10_000, _ephemeral_ports()[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and workers > 1:
        share = (high - low) // workers
        low += int(worker.removeprefix("gw")) * share
        high = low + share
    return low, high


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def libfaketime() -> str | None:
    """Where libfaketime is (Debian's ``faketime`` package), or None."""
    for pattern in LIBFAKETIME:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def faketime_env(offset_s: float) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``offset_s`` off. libfaketime is loaded
    into the process itself rather than through the ``faketime`` command, which forks and would stand
    between the process and whoever signals or waits for it. Only the wall clock: timers and timeouts run on
    the monotonic one, as on a box whose clock is set wrong."""
    library = libfaketime()
    if library is None:
        raise RuntimeError("libfaketime is missing: make setup installs it (Debian's faketime package)")
    return {"LD_PRELOAD": library, "FAKETIME": f"{offset_s:+.0f}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; raise ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait; SIGKILL if it does not exit in time."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class RedisProcess:
    """A private redis-server on a free loopback port, its files in a temporary directory."""

    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-redis-")))
    appendonly: bool = False
    # Clients must AUTH with this password.
    password: str | None = None
    # Serve TLS only, with a certificate from a CA made for it (needs the openssl command).
    tls: bool = False
    # A replica of the redis-server on this port.
    replica_of: int | None = None
    # Run inside this network namespace (``ip netns exec``); it then listens on a unix socket in ``workdir``
    # too, which reaches it from any namespace (``socket_url``).
    netns: str | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        """Its unix socket (listened on only with ``netns``)."""
        return self.workdir / "redis.sock"

    @property
    def socket_url(self) -> str:
        """A URL of its unix socket, for clients in any namespace (only with ``netns``)."""
        auth = f"&password={quote(self.password, safe='')}" if self.password else ""
        return f"unix://{self.socket_path}?db=0{auth}"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            ca = self.workdir / "ca.crt"
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `make setup` (or apt-get install redis-server)"
            )
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            str(self.workdir),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        if self.tls:
            self._make_certificates()
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            for option, name in (("cert", "redis.crt"), ("key", "redis.key"), ("ca-cert", "ca.crt")):
                args += [f"--tls-{option}-file", str(self.workdir / name)]
        prefix: list[str] = []
        if self.netns is not None:
            prefix = ["ip", "netns", "exec", self.netns]
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        self.process = subprocess.Popen(
            [*prefix, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if self.netns is None:
            wait_until(lambda: port_open(self.port), what=f"redis-server on port {self.port}")
        else:
            wait_until(self._socket_open, what=f"redis-server in {self.netns} on {self.socket_path}")
        return self

    def _socket_open(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server in {self.netns} exited with {self.process.returncode}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                return False
        return True

    def in_sync(self) -> bool:
        """This replica has copied its master's data and follows it."""
        with redis.Redis(port=self.port) as conn:
            return bool(conn.info("replication").get("master_link_status") == "up")

    def _make_certificates(self) -> None:
        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=self.workdir, check=True, capture_output=True)

        (self.workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                "-days", "2", "-subj", "/CN=msgbus test CA")  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "redis.key", "-out", "redis.csr",
                "-subj", "/CN=127.0.0.1")  # fmt: skip
        openssl(
            "x509", "-req", "-in", "redis.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "redis.crt", "-days", "2", "-extfile", "san.ext",
        )  # fmt: skip

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class SiteProcess:
    """A msgbusd process for twin ``twin`` with its own identity, Redis and HTTP port."""

    twin: int
    redis_url: str
    twins_file: Path
    mnemonic: str = field(default_factory=new_mnemonic, repr=False)
    key_type: str = "sr25519"
    port: int = field(default_factory=free_port)
    listen_host: str = "127.0.0.1"
    extra_args: Sequence[str] = ()
    log_path: Path | None = None
    # What the twin map says to reach this site (e.g. a proxy in front of it; "": it cannot be dialed);
    # default: its own port.
    advertised_address: str | None = None
    # The relay the twin map names for this site (host:port; empty: none).
    relay: str = ""
    # Look twins up there (``--substrate``: chain or HTTP twin source) instead of in ``twins_file``.
    twin_source: str | None = None
    # Run inside this network namespace (``ip netns exec``); ``url`` then only works from inside it.
    netns: str | None = None
    # Run with the wall clock this far off (libfaketime, from Debian's ``faketime``); None: the machine's.
    clock_offset_s: float | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def public_key(self) -> bytes:
        return load_signer(self.mnemonic, self.key_type).public_key

    @property
    def encryption_key(self) -> bytes:
        """The twin map's ``pk`` for this site (what other sites encrypt for it through a relay)."""
        return bytes(load_signer(self.mnemonic, self.key_type).encryption_key().public_key)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}" if self.advertised_address is None else self.advertised_address

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "msgbusd",
            "--twin",
            str(self.twin),
            "--key-type",
            self.key_type,
            *(["--substrate", self.twin_source] if self.twin_source else ["--twins", str(self.twins_file)]),
            "--redis",
            self.redis_url,
            "--listen",
            f"{self._listen_host()}:{self.port}",
            *self.extra_args,
        ]

    def _listen_host(self) -> str:
        return f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host

    def start(self, timeout_s: float = SITE_START_S) -> SiteProcess:
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix=f"msgbusd-{self.twin}-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["MSGBUS_MNEMONICS"] = self.mnemonic
        with open(self.log_path, "ab") as log_file:
            offset = log_file.tell()
            prefix = ["ip", "netns", "exec", self.netns] if self.netns is not None else []
            if self.clock_offset_s is not None:
                env |= faketime_env(self.clock_offset_s)
            self.process = subprocess.Popen(
                [*prefix, *self.command()], stdout=log_file, stderr=subprocess.STDOUT, env=env
            )
        wait_until(lambda: self._ready_since(offset), timeout_s, f"msgbusd twin {self.twin} to be ready")
        return self

    def _ready_since(self, offset: int) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"msgbusd twin {self.twin} exited with {self.process.returncode}:\n{self.log()}"
            )
        assert self.log_path is not None
        with open(self.log_path, "rb") as log_file:
            log_file.seek(offset)
            return READY_LINE.encode() in log_file.read()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait; returns the exit status."""
        process = self.process
        stop_process(process, timeout_s)
        self.process = None
        return process.returncode if process else None

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class LocalCluster:
    """N sites, each with its own redis-server and msgbusd, sharing one twin map."""

    size: int = 2
    key_type: str = "sr25519"
    extra_args: Sequence[str] = ()
    # More twins for the map, e.g. clients of the proxy flow or a twin whose site is down.
    extra_twins: Sequence[Twin] = ()
    # Redis with an append-only file, as in production (the fault tests restart Redis).
    redis_appendonly: bool = False
    # Sites look twins up there instead of in the twin map (which is still written, for a source to serve).
    twin_source: str | None = None
    # Redis servers that want a password, and speak TLS only (rediss:// URLs).
    redis_password: str | None = None
    redis_tls: bool = False
    # Names of the sites in the twin map, in order (default: site-1, site-2, ...).
    names: Sequence[str] = ()
    # msgbusd processes per site; more than one share the site's port (--reuse-port).
    processes: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-cluster-")))
    redis: list[RedisProcess] = field(default_factory=list)
    sites: list[SiteProcess] = field(default_factory=list)
    # The other processes of each site (with ``processes`` > 1), by twin; ``sites`` holds the first.
    siblings: dict[int, list[SiteProcess]] = field(default_factory=dict)

    @property
    def twins_file(self) -> Path:
        return self.workdir / "twins.json"

    def start(self) -> LocalCluster:
        """Start every Redis and every site."""
        return self.prepare().launch()

    def prepare(self) -> LocalCluster:
        """Start the Redis servers and choose each site's port, without starting the daemons yet."""
        try:
            for index in range(self.size):
                server = RedisProcess(
                    appendonly=self.redis_appendonly, password=self.redis_password, tls=self.redis_tls
                ).start()
                self.redis.append(server)
                twin = index + 1
                shared_port = ["--reuse-port"] if self.processes > 1 else []
                site = SiteProcess(
                    twin=twin,
                    redis_url=server.url,
                    twins_file=self.twins_file,
                    key_type=self.key_type,
                    extra_args=[*self.extra_args, *shared_port],
                    log_path=self.workdir / f"msgbusd-{twin}.log",
                    twin_source=self.twin_source,
                )
                self.sites.append(site)
                self.siblings[twin] = [
                    dataclasses.replace(site, log_path=self.workdir / f"msgbusd-{twin}-{number}.log")
                    for number in range(2, self.processes + 1)
                ]
        except BaseException:
            self.cleanup()
            raise
        return self

    def launch(self) -> LocalCluster:
        """Write the twin map and start the daemons of a prepared cluster."""
        try:
            self.write_twins()
            for site in self.sites:
                site.start()
                for sibling in self.siblings.get(site.twin, []):
                    sibling.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def write_twins(self) -> None:
        # Through a relay, payloads are encrypted for the other end: sr25519 twins publish their key (pk).
        relayed = any(site.relay for site in self.sites)
        twins = [
            Twin(
                id=s.twin,
                address=s.address,
                public_key=s.public_key,
                name=self.name_of(s.twin),
                relay=s.relay,
                encryption_key=s.encryption_key if relayed else None,
            )
            for s in self.sites
        ]
        write_twin_file(self.twins_file, [*twins, *self.extra_twins])

    def name_of(self, twin: int) -> str:
        """The twin map's name of the site of ``twin``."""
        return self.names[twin - 1] if twin <= len(self.names) else f"site-{twin}"

    def processes_of(self, twin: int) -> list[SiteProcess]:
        """Every msgbusd process of ``twin``'s site."""
        return [self.sites[twin - 1], *self.siblings.get(twin, [])]

    def cleanup(self) -> None:
        for site in self.sites:
            site.stop()
        for siblings in self.siblings.values():
            for sibling in siblings:
                sibling.stop()
        for server in self.redis:
            server.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
