"""A Redis that fails over, on this machine: a master, its replica, and three redis-sentinel processes
watching them (Debian's redis-sentinel, or redis-server in sentinel mode)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import redis

from testing.local_sites import RedisProcess, free_port, port_open, stop_process, wait_until

MASTER_NAME = "msgbus"


def sentinel_command(config: Path) -> list[str]:
    binary = shutil.which("redis-sentinel")
    if binary is not None:
        return [binary, str(config)]
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError(
            "redis-server is not installed: run `make setup` (or apt-get install redis-server)"
        )
    return [server, str(config), "--sentinel"]


@dataclass
class SentinelGroup:
    # A master that does not answer for this long is taken for down by the sentinels (two must agree). With
    # 1 s, a loaded machine's pauses had a new master taken for down, and the old master, started again
    # and still copying the data set, promoted empty (docs/reliability.md).
    down_after_ms: int = 3000
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-sentinel-")))
    master: RedisProcess = field(default_factory=RedisProcess)
    replica: RedisProcess | None = None
    sentinel_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def start(self) -> SentinelGroup:
        try:
            self.master.start()
            self.replica = RedisProcess(replica_of=self.master.port).start()
            wait_until(self.replica.in_sync, 20, "the replica to be in sync")
            for index, port in enumerate(self.sentinel_ports):
                config = self.workdir / f"sentinel-{index}.conf"
                config.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                )
                with (self.workdir / f"sentinel-{index}.log").open("ab") as log:
                    self.sentinels.append(subprocess.Popen(sentinel_command(config), stdout=log, stderr=log))
            for port in self.sentinel_ports:
                wait_until(lambda port=port: port_open(port), 20, f"redis-sentinel on {port}")  # type: ignore[misc]
            wait_until(self._sentinels_see_each_other, 30, "the sentinels to find each other and the replica")
        except BaseException:
            self.cleanup()
            raise
        return self

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers says."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port) as sentinel:
                    found = sentinel.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
                    return int(found[1])
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answers")

    def restart_old_master(self, port: int) -> RedisProcess:
        """Start a killed master again on its port: the sentinels make it a replica of the new master."""
        old = self.master if self.master.port == port else self.replica
        assert old is not None
        return old.start()

    def master_switches(self) -> list[str]:
        """The sentinels' ``+switch-master`` events so far (each failover once, as the first sentinel to log
        it wrote it): which master each failover left, and for which."""
        seen: dict[str, str] = {}
        for log in sorted(self.workdir.glob("sentinel-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                _, marker, event = line.partition("+switch-master ")
                if marker:
                    seen.setdefault(event.strip(), line.strip())
        return list(seen.values())

    def _sentinels_see_each_other(self) -> bool:
        for port in self.sentinel_ports:
            with redis.Redis(port=port) as sentinel:
                if len(sentinel.execute_command("SENTINEL", "sentinels", MASTER_NAME)) < 2:
                    return False
                if not sentinel.execute_command("SENTINEL", "replicas", MASTER_NAME):
                    return False
        return True

    def cleanup(self) -> None:
        for process in self.sentinels:
            stop_process(process)
        for server in (self.master, self.replica):
            if server is not None:
                server.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
