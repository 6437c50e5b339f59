"""The many-twins harness: a real site talks to hundreds of twins served by one process, over links and over
POSTs; requests straight to the harness get go-rmb's answers and never stop it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp import web

from client.sync import Client
from msgbusd.identity.signing import Signer, verify, verify_digest
from msgbusd.link.handshake import handshake_digest
from msgbusd.link.link_sockets import REFUSED
from testing.local_sites import LocalCluster, free_port, wait_until
from testing.many_twins import STATS_LINE, ManyTwinsProcess, TwinRange, add_to_twin_file, twin_signer
from twin_resolver.base import Twin
from twin_resolver.static import load_twin_file, write_twin_file
from wire import keys
from wire.envelope import Envelope, encode_payload

pytestmark = pytest.mark.timeout(90)

CMD = "many.echo"


def test_every_process_computes_the_same_twins() -> None:
    assert twin_signer(1000).public_key == twin_signer(1000).public_key != twin_signer(1001).public_key
    harness = ManyTwinsProcess(first=10, count=5, down=1, down_ids=[11])
    assert (harness.up_ids, harness.down_twin_ids) == ([10, 12, 13], [11, 14])
    addresses = {twin.id: twin.address for twin in harness.twins()}
    # Each twin at an address of its own, as if it had a site of its own.
    assert addresses[10] == f"http://127.1.0.1:{harness.port}/t/10"
    assert addresses[14] == f"http://127.1.0.5:{harness.down_port}/t/14"
    with pytest.raises(ValueError, match=r"down twins \[99\] are not in 10\.\.14"):
        TwinRange.of(10, 5, down_ids=[99])


def test_the_twins_join_a_twin_file_once_and_keep_its_other_twins(tmp_path: Path) -> None:
    site = Twin(id=1, address="127.0.0.1:8051", public_key=Signer(os.urandom(32), "ed25519").public_key)
    twins_file = tmp_path / "twins.json"
    write_twin_file(twins_file, [site])
    twins = ManyTwinsProcess(count=3).twins()
    assert add_to_twin_file(twins_file, twins)
    assert load_twin_file(twins_file) == {twin.id: twin for twin in [site, *twins]}
    assert not add_to_twin_file(twins_file, twins)


@pytest.mark.processes
@pytest.mark.parametrize(
    ("links", "site_args", "way"),
    [
        # The site links at a twin's first message.
        (True, ["--link-after", "1"], "link"),
        # The twins take no links (go-rmb).
        (False, [], "post"),
        # By default one message to a twin goes in a POST: no handshake for a twin talked to once.
        (True, [], "post"),
    ],
    ids=["links", "posts", "once"],
)
def test_a_site_gets_each_up_twins_signed_answer_and_an_error_for_each_down_twin(
    links: bool, site_args: list[str], way: str
) -> None:
    harness = ManyTwinsProcess(count=300, down=40, down_ids=[1003], links=links)
    cluster = LocalCluster(size=1, extra_args=site_args, extra_twins=harness.twins()).start()
    try:
        harness.start(cluster.twins_file)
        with Client(cluster.redis[0].url) as client:
            # retries=0: a twin that is down gets its error after the first attempt.
            rets = {
                twin: client.send(twin, CMD, b"to %d" % twin, exp=60, retries=0) for twin in range(1000, 1300)
            }
            replies = {twin: client.wait(ret, timeout=30)[0] for twin, ret in rets.items()}
        up, down = harness.up_ids, harness.down_twin_ids
        # The site checked each reply's signature against the twin's key before its caller got it.
        assert {twin: (replies[twin].error, replies[twin].data) for twin in up} == {
            twin: ("", b"to %d" % twin) for twin in up
        }
        for twin in down:
            assert replies[twin].error.startswith(f"all retries done: couldn't reach twin {twin} at "), twin
        # What found each down twin down failed for good: nothing of it is left to wait for the twin, and the
        # log does not say that something waits.
        with redis.Redis.from_url(cluster.redis[0].url) as site_redis:
            waiting = [keys.send_queue(twin) for twin in down] + [keys.give_up(twin) for twin in down]
            wait_until(lambda: not site_redis.exists(*waiting), 10, "the down twins' queues gone")
        assert "holding messages to twin" not in cluster.sites[0].log()
        other = "post" if way == "link" else "link"
        stats = harness.wait_for(lambda s: s["replies"][way] == len(up), what=f"{len(up)} replies by {way}")
        assert stats["requests"] == {way: len(up), other: 0}
        assert stats["replies"] == {way: len(up), other: 0}
        assert (stats["refused"], stats["replies_failed"]) == (0, 0)
        assert stats["links"]["opened"] == (len(up) if way == "link" else 0)
        per_twin = harness.stats(per_twin=True)["per_twin"]
        assert per_twin == {str(twin): {"received": 1, "answered": 1} for twin in up}
        assert harness.stop() == 0
        assert (
            f'{STATS_LINE}: {{"twins": 300, "down": 41, "requests": {json.dumps(stats["requests"])}'
            in harness.log()
        )
    finally:
        harness.stop()
        cluster.cleanup()


class FakeSite:
    """Twin 1's site, played by the test: it signs requests and takes the replies POSTed to it."""

    def __init__(self) -> None:
        self.signer = Signer(os.urandom(32), "ed25519")
        self.port = free_port()
        self.replies: asyncio.Queue[Envelope] = asyncio.Queue()

    @property
    def twin(self) -> Twin:
        return Twin(id=1, address=f"127.0.0.1:{self.port}", public_key=self.signer.public_key)

    def request(self, dst: int, data: bytes, *, uid: str = "", age_s: int = 0) -> Envelope:
        """A request to twin ``dst``, signed by this site."""
        env = Envelope(
            uid=uid or f"{dst}.1", cmd=CMD, dat=encode_payload(data), src=1, dst=(dst,),
            ret="msgbus.system.reply", now=int(time.time()) - age_s,
        )  # fmt: skip
        return self.signer.sign(env)

    async def next_reply(self) -> Envelope:
        return await asyncio.wait_for(self.replies.get(), 10)

    async def _take_reply(self, request: web.Request) -> web.Response:
        self.replies.put_nowait(Envelope.decode(await request.read()))
        return web.json_response({"status": "accepted"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/zbus-reply", self._take_reply)
        return app


@pytest.fixture
async def fake_site() -> AsyncIterator[FakeSite]:
    site = FakeSite()
    runner = web.AppRunner(site.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", site.port).start()
    try:
        yield site
    finally:
        await runner.cleanup()


@pytest.fixture
def harness(fake_site: FakeSite, tmp_path: Path) -> Iterator[ManyTwinsProcess]:
    """Twins 1000 and 1001 up, 1002 down, replying 5 bytes; the twin file's only site is the fake one."""
    twins_file = tmp_path / "twins.json"
    write_twin_file(twins_file, [fake_site.twin])
    harness = ManyTwinsProcess(count=3, down=1, reply_bytes=5).start(twins_file)
    try:
        yield harness
    finally:
        harness.stop()


async def stats_when(
    harness: ManyTwinsProcess, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The harness's counts once ``condition`` holds (read in a thread: this loop serves the fake site)."""
    deadline = time.monotonic() + 10
    while not condition(stats := await asyncio.to_thread(harness.stats)):
        assert time.monotonic() < deadline, f"the counts never got there: {stats}"
        await asyncio.sleep(0.01)
    return stats


def assert_signed_reply(reply: Envelope, request: Envelope, twin: int) -> None:
    """``reply`` answers ``request`` as ``twin`` does (``--reply-bytes 5``), signed with its key."""
    assert (reply.uid, reply.cmd, reply.src, reply.dst, reply.ret) == (
        request.uid,
        CMD,
        twin,
        (1,),
        request.ret,
    )
    assert (reply.dat, reply.err) == (encode_payload(b"r" * 5), "")
    verify(reply, twin_signer(twin).public_key)


@pytest.mark.processes
async def test_bad_requests_get_go_rmbs_answers_and_the_twins_keep_serving(
    fake_site: FakeSite, harness: ManyTwinsProcess
) -> None:
    remote = f"{harness.url}/t/1000/zbus-remote"
    request = fake_site.request(1000, b"first")
    stranger = Signer(os.urandom(32), "ed25519")
    refusals = {
        b"": "couldn't parse json",
        b"{not json": "couldn't parse json",
        b'{"src": "1"}': "couldn't parse json",
        # Two minutes old when stamped; the answer counts to when it arrived.
        fake_site.request(1000, b"old", age_s=120).encode(): "message is too old, sent since 2m",
        fake_site.signer.sign(request.replace(src=77)).encode(): "source twin 77 not found",
        stranger.sign(request).encode(): "couldn't verify signature",
        request.replace(dat=encode_payload(b"changed")).encode(): "couldn't verify signature",
        request.replace(sig="").encode(): "signature field is empty",
    }
    async with aiohttp.ClientSession() as http:
        for body, message in refusals.items():
            async with http.post(remote, data=body) as response:
                answer = await response.json(content_type=None)
                assert (response.status, answer["Status"]) == (400, "error"), body
                assert answer["Message"].startswith(message), (body, answer)
        for url, status in (
            (f"{harness.url}/t/1000/zbus-batch", 404),
            (f"{harness.url}/t/1002/zbus-remote", 404),
            # The address of no twin.
            (f"{harness.url}/zbus-remote", 404),
        ):
            async with http.post(url, data=request.encode()) as response:
                assert response.status == status, url
        for sent, url in (
            (request, f"{harness.url}/t/1000/zbus-remote"),
            # A site that reaches a twin at its address alone (go-rmb).
            (fake_site.request(1001, b"second"), f"http://127.1.0.2:{harness.port}/zbus-remote"),
        ):
            async with http.post(url, data=sent.encode()) as response:
                assert (response.status, await response.json()) == (200, {"status": "accepted"})
            assert_signed_reply(await fake_site.next_reply(), sent, sent.dst[0])
    stats = await stats_when(harness, lambda s: s["replies"]["post"] == 2)
    assert (stats["refused"], stats["requests"]["post"], stats["replies_failed"]) == (len(refusals), 2, 0)
    per_twin = (await asyncio.to_thread(harness.stats, per_twin=True))["per_twin"]
    assert per_twin == {"1000": {"received": 1, "answered": 1}, "1001": {"received": 1, "answered": 1}}


@pytest.mark.processes
async def test_a_link_is_opened_as_the_twin_and_carries_its_replies(
    fake_site: FakeSite, harness: ManyTwinsProcess
) -> None:
    link_url = f"ws://127.0.0.1:{harness.port}/t/1001/zbus-link"
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(link_url) as ws:
            await say_hello(ws, Signer(os.urandom(32), "ed25519"))
            assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == REFUSED
        async with http.ws_connect(link_url) as ws:
            nonce = await say_hello(ws, fake_site.signer)
            welcome = json.loads((await ws.receive()).data)
            verify_digest(welcome["sig"], handshake_digest(1001, 1, nonce), twin_signer(1001).public_key)
            request = fake_site.request(1001, b"by link")
            messages = [
                {"path": "/zbus-remote", "envelope": request.to_wire()},
                {"path": "/zbus-remote", "envelope": "not an envelope"},
                {"path": "/zbus-remote", "envelope": request.replace(src=77).to_wire()},
            ]
            await ws.send_bytes(json.dumps({"op": "send", "id": 1, "messages": messages}).encode())
            ack = json.loads((await ws.receive()).data)
            assert ack == {
                "op": "ack",
                "id": 1,
                "results": [
                    {"status": 200},
                    {"status": 400, "message": "couldn't parse json"},
                    {"status": 400, "message": "this link carries twin 1's messages only"},
                ],
            }
            frame = json.loads((await ws.receive()).data)
            assert frame["op"] == "send" and [m["path"] for m in frame["messages"]] == ["/zbus-reply"]
            assert_signed_reply(Envelope.from_wire(frame["messages"][0]["envelope"]), request, 1001)
            await ws.send_bytes(
                json.dumps({"op": "ack", "id": frame["id"], "results": [{"status": 200}]}).encode()
            )
            stats = await stats_when(harness, lambda s: s["replies"]["link"] == 1)
    assert stats["requests"] == {"link": 1, "post": 0}
    assert stats["links"] == {"open": 1, "opened": 1, "refused": 1}
    assert stats["refused"] == 2


async def say_hello(ws: aiohttp.ClientWebSocketResponse, signer: Signer) -> str:
    """The opener's half of the handshake up to its hello, as twin 1 with ``signer``'s key; returns the
    opener's nonce."""
    challenge = json.loads((await ws.receive()).data)
    assert (challenge["op"], challenge["twin"]) == ("challenge", 1001)
    sig = signer.sign_digest(handshake_digest(1, 1001, challenge["nonce"])).hex()
    nonce = os.urandom(16).hex()
    await ws.send_bytes(json.dumps({"op": "hello", "twin": 1, "nonce": nonce, "sig": sig}).encode())
    return nonce
