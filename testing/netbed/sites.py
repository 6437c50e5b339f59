"""msgbus sites on the hosts of a bed: each a private redis-server and a msgbusd inside the host's
namespace, all sharing one twin map.

The daemon reaches its Redis on 127.0.0.1 inside the namespace; the test, in the root namespace, reaches
the same Redis through its unix socket (``BedSite.redis_url``). The twin map lists each site at its host's
address, or with no address for an edge behind NAT, which nobody can dial.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from testing.local_sites import RedisProcess, SiteProcess
from testing.netbed.hosts import Host
from twin_resolver.base import Twin
from twin_resolver.static import write_twin_file

SITE_PORT = 8051
REDIS_PORT = 6379


@dataclass(eq=False)
class BedSite:
    """One site on ``host``: its Redis and its msgbusd (started by :meth:`BedSites.start`)."""

    host: Host
    redis: RedisProcess
    daemon: SiteProcess

    @property
    def twin(self) -> int:
        return self.daemon.twin

    @property
    def redis_url(self) -> str:
        """The site's Redis for clients and services in the root namespace (a unix socket URL)."""
        return self.redis.socket_url

    @property
    def url(self) -> str:
        """The daemon's HTTP address, for clients inside the bed."""
        return f"http://{self.host.address}:{self.daemon.port}"

    def log(self) -> str:
        """What the daemon has logged so far."""
        return self.daemon.log()


@dataclass
class BedSites:
    """Sites on hosts of a bed, sharing one twin map: :meth:`add` each, then :meth:`start` them all."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="msgbus-bed-")))
    sites: list[BedSite] = field(default_factory=list)

    @property
    def twins_file(self) -> Path:
        return self.workdir / "twins.json"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    def add(
        self,
        host: Host,
        *,
        twin: int | None = None,
        extra_args: Sequence[str] = (),
        port: int = SITE_PORT,
        key_type: str = "sr25519",
    ) -> BedSite:
        """A site on ``host`` for ``twin`` (default: the next number), its daemon run with ``extra_args``
        (e.g. ``["--uplink", "1"]``) and listening on ``host.address:port``. Its Redis starts now."""
        twin = len(self.sites) + 1 if twin is None else twin
        redis = RedisProcess(port=REDIS_PORT, netns=host.netns, workdir=self._dir(f"redis-{twin}")).start()
        daemon = SiteProcess(
            twin=twin,
            redis_url=redis.url,
            twins_file=self.twins_file,
            key_type=key_type,
            port=port,
            listen_host=host.address,
            extra_args=extra_args,
            log_path=self.workdir / f"msgbusd-{twin}.log",
            advertised_address="" if host.behind_nat else f"{host.address}:{port}",
            netns=host.netns,
        )
        site = BedSite(host, redis, daemon)
        self.sites.append(site)
        return site

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir()
        return path

    def write_twins(self) -> None:
        """Write the twin map of every site added so far."""
        twins = [
            Twin(
                id=site.twin,
                address=site.daemon.address,
                public_key=site.daemon.public_key,
                name=f"{site.host.role}-{site.twin}",
            )
            for site in self.sites
        ]
        write_twin_file(self.twins_file, twins)

    def start(self) -> Self:
        """Write the twin map and start every daemon not running yet, each waited for until ready."""
        self.write_twins()
        for site in self.sites:
            if site.daemon.process is None:
                site.daemon.start()
        return self

    def cleanup(self) -> None:
        """Stop every daemon and Redis and remove their files."""
        for site in self.sites:
            site.daemon.stop()
        for site in self.sites:
            site.redis.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
