"""``msgbus demo``: two real sites on this machine, a service, and the main ways of calling it.

Starts two private redis-server processes and two msgbusd sites with fresh identities and a temporary twin
map, serves ``demo.echo`` on both sites, then shows: one request, a request to several twins, one to a twin
that does not exist, and the HTTP proxy flow (``/zbus-cmd`` + ``/zbus-result``). With an event log
directory, both sites write their event logs there and the demo adds a burst of traffic, ready for
``msgbus mine``. Cleans up on the way out, also after Ctrl-C. Needs the daemon extra
(``pip install 'msgbus[daemon]'``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from client.replies import Reply
from client.request import Request
from client.service import Service
from client.sync import Client

ECHO = "demo.echo"
UNKNOWN_TWIN = 99
PROXY_CLIENT_TWIN = 50


TRAFFIC_REQUESTS = 300


def run_demo(
    say: Callable[[str], None] = print, event_log: Path | None = None, *, keep: bool = False
) -> None:
    """Run the whole demo, printing what happens with ``say``; with ``event_log``, sites log their events
    there."""
    import httpx

    from msgbusd.identity.keys import load_signer, new_mnemonic
    from testing.local_sites import LocalCluster
    from twin_resolver.base import Twin
    from wire.envelope import Envelope

    proxy_signer = load_signer(new_mnemonic(), "sr25519")
    cluster = LocalCluster(
        size=2,
        extra_args=[
            "--retry-delay",
            "0.2",
            "--retry-max-delay",
            "0.5",
            *(["--event-log", str(event_log)] if event_log is not None else []),
        ],
        extra_twins=[Twin(PROXY_CLIENT_TWIN, "", proxy_signer.public_key, name="http-client")],
    )
    say("msgbus demo: starting two sites on this machine (redis-server + msgbusd each)...")
    cluster.start()
    try:
        for site, redis in zip(cluster.sites, cluster.redis, strict=True):
            say(f"  site {site.twin}: twin {site.twin}, http {site.url}, redis {redis.url}")
        say(f"  twin map: {cluster.twins_file}")
        with _echo_services([r.url for r in cluster.redis]), Client(cluster.redis[0].url) as client:
            say(f'  both sites serve "{ECHO}" (answers the payload in upper case)\n')

            say(f"1. One request from site 1 to twin 2: {ECHO} 'hello msgbus'")
            started = time.perf_counter()
            (reply,) = client.call(2, ECHO, b"hello msgbus", timeout=30)
            _show(say, reply, time.perf_counter() - started)

            say(f"\n2. One request to twins 1 and 2 (its own site and the other): {ECHO} 'fan out'")
            started = time.perf_counter()
            for reply in client.call([1, 2], ECHO, b"fan out", timeout=30):
                _show(say, reply, time.perf_counter() - started)

            say(f"\n3. A request to twin {UNKNOWN_TWIN}, which is in no twin map (try=1: two attempts)")
            (reply,) = client.call(UNKNOWN_TWIN, ECHO, b"anyone?", retries=1, timeout=30)
            _show(say, reply, None)

            say(
                "\n4. An HTTP client without a site of its own (the proxy flow), signed as twin "
                f"{PROXY_CLIENT_TWIN}: POST /zbus-cmd to site 2, then poll /zbus-result"
            )
            request = Envelope(
                cmd=ECHO,
                dat="cHJveHkgY2FsbA==",
                src=PROXY_CLIENT_TWIN,
                dst=(2,),
                now=int(time.time()),
                pxy=True,
            )
            with httpx.Client(base_url=cluster.sites[1].url, trust_env=False, timeout=10) as http:
                answer = http.post("/zbus-cmd", content=proxy_signer.sign(request).encode())
                say(f"   /zbus-cmd answered {answer.status_code} {answer.text}")
                retqueue = answer.json()["retqueue"]
                results = _poll_result(http, retqueue)
            for item in results:
                say(f"   /zbus-result: {json.dumps({k: item[k] for k in ('uid', 'src', 'dat', 'err')})}")
            if event_log is not None:
                _traffic(say, client)
            say(
                "\nDone. Everything above went through real Redis lists and signed HTTP between the two "
                "daemons."
            )
            if keep:
                _keep_up(say, cluster.redis[0].url)
    finally:
        say("cleaning up: stopping the sites and their redis-servers")
        cluster.cleanup()
    if event_log is not None:
        say(f"\nEvent logs of both sites: {event_log}. Turn them into a report with:")
        say(f"   msgbus mine --events '{event_log}/*.jsonl' --out msgbus-report")


def _keep_up(say: Callable[[str], None], redis_url: str) -> None:
    """Serve on until Ctrl-C (KeyboardInterrupt), for calls from another terminal."""
    say(
        "\nThe sites stay up until Ctrl-C. From another terminal, through site 1:\n"
        f"   msgbus send --redis {redis_url} --dst 2 --cmd {ECHO} --data hello"
    )
    while True:
        time.sleep(3600)


def _traffic(say: Callable[[str], None], client: Client) -> None:
    say(f"\n5. {TRAFFIC_REQUESTS} more requests for the event log: to twins 1 and 2, and a few to twin 99")
    errors = 0
    for index in range(TRAFFIC_REQUESTS):
        dst = UNKNOWN_TWIN if index % 50 == 49 else 1 + index % 2
        for reply in client.call(dst, ECHO, b"traffic %d" % index, timeout=30):
            errors += bool(reply.error)
    say(f"   {TRAFFIC_REQUESTS} round trips, {errors} answered with an error")


def _show(say: Callable[[str], None], reply: Reply, elapsed_s: float | None) -> None:
    timing = f" in {elapsed_s * 1000:.1f} ms" if elapsed_s is not None else ""
    if reply.error:
        say(f"   twin {reply.src} -> error: {reply.error}")
    else:
        say(f"   twin {reply.src} -> {reply.text()!r} (uid {reply.uid}){timing}")


def _poll_result(http: object, retqueue: str, timeout_s: float = 15.0) -> list[dict[str, object]]:
    import httpx

    assert isinstance(http, httpx.Client)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = http.post("/zbus-result", content=json.dumps({"retqueue": retqueue})).json()
        if items:
            return list(items)
        time.sleep(0.1)
    raise TimeoutError(f"no result in {retqueue} after {timeout_s}s")


@contextmanager
def _echo_services(redis_urls: list[str]) -> Iterator[None]:
    services = []
    threads = []
    for url in redis_urls:
        service = Service(url, workers=4, poll_interval=0.2)
        service.register(ECHO, _upper)
        services.append(service)
        thread = threading.Thread(target=asyncio.run, args=(service.serve(),), daemon=True)
        thread.start()
        threads.append(thread)
    try:
        yield
    finally:
        for service in services:
            service.stop()
        for thread in threads:
            thread.join(timeout=5)


def _upper(request: Request) -> bytes:
    return request.data.upper()
