"""The floor of a site that talks to many twins: what sending one request to a twin and taking its reply
costs at the least with the libraries msgbusd uses, to say how far msgbusd's CPU per request is from it.

It does only what the wire asks of any RMB site: pops the local requests (in batches), stamps and signs each
as the site's twin, POSTs it to ``/zbus-remote`` of its twin on a connection of its own (as go-rmb does),
serves ``/zbus-reply`` with uvicorn, checks the reply's signature against its twin's key and pushes it to its
return queue (in batches). Nothing else: nothing kept in Redis while in flight (a crash loses it all), no
retries, no expiry, no links, no de-duplication, no logs, no metrics, no checks of the HTTP request beyond
the signature. Its cyclic garbage collector is set as msgbusd's is.

    python -m bench.floor_site --redis URL --port PORT --seed HEX --twins FILE [--twin 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import socket
import time
from typing import cast

import uvloop
from starlette.types import Receive, Scope, Send

from msgbusd.identity.signing import SignatureError, Signer, verify
from msgbusd.link.http_reply import HttpFailed
from msgbusd.link.one_shot import OneShotRequests
from msgbusd.sending.posts import REMOTE_PATH, REPLY_PATH
from msgbusd.site.garbage import settle_after_start_up
from msgbusd.site.serving import serve_until
from twin_resolver.address import peer_url
from twin_resolver.static import load_twin_file
from wire import keys
from wire.envelope import Envelope, EnvelopeDecodeError
from wire.redis_url import async_client

IN_FLIGHT = 512
BATCH = 256
POST_TIMEOUT_S = 10.0
READY_LINE = "floor site ready"
_ACCEPTED = b'{"status":"accepted"}'
_JSON = [(b"content-type", b"application/json")]


class FloorSite:
    def __init__(self, redis_url: str, twin: int, signer: Signer, twins_file: str) -> None:
        self.twin = twin
        self.signer = signer
        self.twins = load_twin_file(twins_file)
        self.redis = async_client(redis_url)
        self.http = OneShotRequests()
        self.uids = itertools.count(1)
        # uid -> the return queue of the request it was given, while its reply is awaited.
        self.waiting: dict[str, str] = {}
        self.replies: list[tuple[str, bytes]] = []
        self.replies_ready = asyncio.Event()

    async def send_requests(self) -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        posts: set[asyncio.Task[None]] = set()
        while True:
            # Pops of a second at most: redis-py cuts a longer one with its socket timeout.
            popped = cast(tuple[bytes, bytes] | None, await self.redis.blpop([keys.LOCAL], timeout=1))
            if popped is None:
                continue
            raws = [popped[1], *(await self.redis.lpop(keys.LOCAL, BATCH - 1) or [])]
            for raw in raws:
                try:
                    request = Envelope.decode(raw)
                except EnvelopeDecodeError:
                    continue  # not an envelope: nobody to answer
                await slots.acquire()
                post = asyncio.create_task(self._send(request))
                posts.add(post)
                post.add_done_callback(posts.discard)
                post.add_done_callback(lambda _: slots.release())

    async def _send(self, request: Envelope) -> None:
        twin = request.dst[0] if request.dst else 0
        uid = f"{self.twin}.{next(self.uids)}"
        self.waiting[uid] = request.ret
        failure = await self._post(twin, request.replace(uid=uid, src=self.twin, now=int(time.time())))
        if failure is not None and self.waiting.pop(uid, None) is not None:
            answer = request.replace(uid=uid, src=twin, dst=(self.twin,), dat="", err=failure)
            self._reply(request.ret, answer.encode())

    async def _post(self, twin: int, request: Envelope) -> str | None:
        """POST ``request``, signed, to ``twin``; what went wrong, if anything."""
        if twin not in self.twins:
            return f"twin {twin} is not in the twin file"
        try:
            reply = await self.http.request(
                "POST",
                peer_url(self.twins[twin].address, REMOTE_PATH),
                headers=[("Content-Type", "application/json")],
                content=self.signer.sign(request).encode(),
                timeout_s=POST_TIMEOUT_S,
            )
        except HttpFailed as exc:
            return str(exc)
        return None if reply.status == 200 else f"HTTP {reply.status}"

    def _reply(self, ret: str, raw: bytes) -> None:
        self.replies.append((ret, raw))
        self.replies_ready.set()

    async def push_replies(self) -> None:
        while True:
            await self.replies_ready.wait()
            self.replies_ready.clear()
            replies, self.replies = self.replies, []
            async with self.redis.pipeline(transaction=False) as pipe:
                for ret, raw in replies:
                    pipe.lpush(ret, raw)
                await pipe.execute()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        status = 400
        if scope["path"] == REPLY_PATH:
            try:
                reply = Envelope.decode(body)
                verify(reply, self.twins[reply.src].public_key)
            except (EnvelopeDecodeError, SignatureError, KeyError):
                pass
            else:
                status = 200
                ret = self.waiting.pop(reply.uid, None)
                if ret is not None:
                    self._reply(ret, body)
        await send({"type": "http.response.start", "status": status, "headers": _JSON})
        await send({"type": "http.response.body", "body": _ACCEPTED if status == 200 else b"{}"})


async def run(args: argparse.Namespace) -> None:
    site = FloorSite(args.redis, args.twin, Signer(bytes.fromhex(args.seed), "ed25519"), args.twins)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    sock.setblocking(False)
    workers = [asyncio.create_task(site.send_requests()), asyncio.create_task(site.push_replies())]
    settle_after_start_up()  # the cyclic collector set as msgbusd sets it
    print(READY_LINE, flush=True)
    try:
        await serve_until(site, sock, asyncio.Event(), grace_s=1)
    finally:
        for worker in workers:
            worker.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", required=True, help="the site's Redis URL")
    parser.add_argument("--port", type=int, required=True, help="the port of /zbus-reply, on 127.0.0.1")
    parser.add_argument("--seed", required=True, help="the site twin's ed25519 seed, in hex")
    parser.add_argument("--twins", required=True, help="a twin file (msgbus's format) with every twin")
    parser.add_argument("--twin", type=int, default=1, help="the site's twin id")
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
