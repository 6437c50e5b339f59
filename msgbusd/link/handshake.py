"""A link's handshake (:mod:`msgbusd.link.links` tells its frames): the opener dials the site's link
endpoint and introduces itself (``hello``, signed by its twin key over the site's nonce), the site greets it
(``welcome``, signed over the opener's nonce), each side checks the other's signature against the resolver,
and each learns from the other's stamp how far its clock is (:mod:`msgbusd.link.peer_clocks`)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

import aiohttp
import orjson

from msgbusd.errors import DeliveryError
from msgbusd.identity.signing import SignatureError, Signer, verify_digest
from msgbusd.link.http_client import HttpClients
from msgbusd.link.link_admission import BUSY_STATUS, RETRY_AFTER, come_back_in_s
from msgbusd.link.link_keepalive import opener_keepalive
from msgbusd.link.link_sockets import REFUSED, ClientSocket, LinkClosed, Socket
from msgbusd.link.loop_turns import LoopTurns
from msgbusd.link.peer_clocks import PeerClocks, read_stamp, stamp
from msgbusd.reports.logs import about
from twin_resolver.base import Resolver, ResolverError

log = logging.getLogger("msgbusd.links")

# Handshakes that check their hello and sign their welcome in one turn of the event loop, at most (each
# takes about a quarter of a millisecond).
CHECKS_PER_TURN = 8


class LinkUnsupported(Exception):
    """The peer's site answered the upgrade with plain HTTP: it is not a msgbus site."""


def handshake_digest(signer_twin: int, other_twin: int, nonce: str) -> bytes:
    """What a handshake signature covers: who signs, for whom, and the other side's fresh nonce."""
    return hashlib.sha256(f"msgbus-link\n{signer_twin}\n{other_twin}\n{nonce}".encode()).digest()


class Handshakes:
    """The handshakes of the links of site ``twin``: both halves, the opener's (:meth:`dial`) and the
    site's (:meth:`greet_in_time`)."""

    def __init__(
        self,
        twin: int,
        signer: Signer,
        resolver: Resolver,
        http: HttpClients,
        clocks: PeerClocks,
        *,
        max_frame_bytes: int,
        timeout_s: float,
        ping_s: float,
    ) -> None:
        self._twin = twin
        self._signer = signer
        self._resolver = resolver
        self._http = http
        # The peers' clocks, measured at each handshake (which is stamped with this site's).
        self.clocks = clocks
        self._max_frame_bytes = max_frame_bytes
        self._timeout_s = timeout_s
        self._ping_s = ping_s
        # The handshakes of links opened to this site check and sign a few at a time in each turn of the
        # event loop: a herd's hellos come by the hundred.
        self._checking = LoopTurns(CHECKS_PER_TURN)

    async def dial(
        self, twin_id: int | None, url: str, public_key: bytes | None, *, uplink: bool
    ) -> tuple[ClientSocket, int, int, bool]:
        """Open a link's connection to twin ``twin_id`` at ``url`` (whose key is ``public_key``), or
        (``twin_id`` None) to the relay there, whichever twin it is, and go through the opener's half of the
        handshake (``uplink``: kept open for the other end to send over it): the socket, the twin at the
        other end, the largest envelope its site takes, and whether it reads frames in parts. Raises
        :class:`LinkUnsupported` when the site answers the upgrade with plain HTTP, :class:`DeliveryError`
        when it cannot be reached or fails the handshake."""
        what = f"twin {twin_id}" if twin_id is not None else "the relay"
        try:
            ws = await self._http.websocket(
                "ws" + url.removeprefix("http"),
                max_message_bytes=self._max_frame_bytes + 4096,
                timeout_s=self._timeout_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            turn_s = come_back_in_s(exc.headers.get(RETRY_AFTER)) if exc.headers is not None else None
            if exc.status == BUSY_STATUS and turn_s is not None:
                raise DeliveryError(
                    f"the site of {what} at {url} lets no more links begin now: "
                    f"dialing again in {turn_s:.1f}s",
                    kind="busy",
                    retry_after_s=turn_s,
                ) from exc
            if exc.status in (502, 503, 504):
                raise DeliveryError(
                    f"{what} at {url} cannot take messages now: {exc.status}", offline=True
                ) from exc
            raise LinkUnsupported(f"the upgrade was answered {exc.status}") from exc
        except TimeoutError as exc:
            raise DeliveryError(f"{what} at {url} did not answer in time", offline=True) from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"couldn't reach {what} at {url}: {exc}", offline=True) from exc
        socket = ClientSocket(ws)
        opener_keepalive(self._ping_s).apply_to(socket.pacing.transport)
        try:
            async with asyncio.timeout(self._timeout_s):
                peer, peer_max_bytes, reads_parts = await self._introduce(
                    socket, twin_id, public_key, uplink=uplink
                )
        except TimeoutError as exc:
            await socket.close(1000, "no handshake in time")
            raise DeliveryError(f"{what} at {url} did not answer in time", offline=True) from exc
        except LinkClosed as exc:
            await socket.close(1000, str(exc))
            if exc.refused:
                raise DeliveryError(f"{what} at {url} refused a link: {exc}", kind="refused") from exc
            # Cut during the handshake: like a connection that failed.
            raise DeliveryError(f"couldn't reach {what} at {url}: {exc}", offline=True) from exc
        log.info("opened a link to %s at %s (twin %s)", what, url, peer, extra=about(twin=peer))
        return socket, peer, peer_max_bytes, reads_parts

    async def greet_in_time(self, socket: Socket) -> tuple[int, int, bool, bool] | None:
        """The site's half of the handshake of a link a peer opened (:meth:`_greet`), within the timeout;
        None when it is refused or cut (the socket is closed)."""
        try:
            # A timeout of the task itself rather than wait_for's, whose failure is a cycle (its inner task
            # holds the error, whose traceback holds the task) that waits for the cyclic collector.
            async with asyncio.timeout(self._timeout_s):
                return await self._greet(socket)
        except (TimeoutError, _Refused, LinkClosed) as exc:
            reason = str(exc) if isinstance(exc, _Refused) else "no handshake in time"
            if not isinstance(exc, LinkClosed):
                log.warning("refused a link: %s", reason)
                await socket.close(REFUSED, reason)
            return None

    async def _introduce(
        self, socket: Socket, twin_id: int | None, public_key: bytes | None, *, uplink: bool
    ) -> tuple[int, int, bool]:
        """The opener's half of the handshake: the twin at the other end (``twin_id``, or for a relay the
        twin it proves to be), the largest envelope its site takes, and whether it reads frames in parts.
        Raises :class:`LinkClosed` when it fails."""
        challenge = _frame(await socket.receive(), "challenge", socket)
        if twin_id is None or public_key is None:
            twin_id, public_key = await self._relay_identity(challenge.get("twin"))
        elif challenge.get("twin") != twin_id:
            raise LinkClosed(
                f"the site there is twin {challenge.get('twin')}, not twin {twin_id}", refused=True
            )
        nonce = os.urandom(16).hex()
        their_nonce = str(challenge.get("nonce", ""))
        sig = self._signer.sign_digest(handshake_digest(self._twin, twin_id, their_nonce)).hex()
        hello: dict[str, Any] = {"op": "hello", "twin": self._twin, "nonce": nonce, "sig": sig}
        if uplink:
            hello["uplink"] = True
        sent_at = self.clocks.now()
        hello |= stamp(self._signer, self._twin, twin_id, their_nonce, sent_at)
        await socket.send(orjson.dumps({**hello, "max_bytes": self._max_frame_bytes, "parts": True}))
        welcome = _frame(await socket.receive(), "welcome", socket)
        received_at = self.clocks.now()
        try:
            digest = handshake_digest(twin_id, self._twin, nonce)
            verify_digest(str(welcome.get("sig", "")), digest, public_key)
        except SignatureError as exc:
            raise LinkClosed(f"the site there is not twin {twin_id}: {exc.message}", refused=True) from exc
        peer_time_s = read_stamp(welcome, twin_id, self._twin, nonce, public_key)
        if peer_time_s is not None:
            self.clocks.measured_on_link(twin_id, peer_time_s, sent_at, received_at)
        return twin_id, _max_bytes(challenge, self._max_frame_bytes), challenge.get("parts") is True

    async def _relay_identity(self, claimed: object) -> tuple[int, bytes]:
        """A relay is named by its address only: it is whichever twin it says, once it proves it holds that
        twin's key (its welcome is checked against it)."""
        if not isinstance(claimed, int) or isinstance(claimed, bool) or claimed <= 0:
            raise LinkClosed(f"the relay says it is twin {claimed!r}", refused=True)
        try:
            return claimed, (await self._resolver.get_twin(claimed)).public_key
        except ResolverError as exc:
            raise LinkClosed(f"couldn't get the relay's twin {claimed}: {exc}", refused=True) from exc

    async def _greet(self, socket: Socket) -> tuple[int, int, bool, bool]:
        """The site's half of the handshake: the opener's twin, once it proved it holds that twin's key, the
        largest envelope the opener takes, whether it opens the link as its uplink, and whether it reads
        frames in parts."""
        nonce = os.urandom(16).hex()
        challenge = {
            "op": "challenge",
            "twin": self._twin,
            "nonce": nonce,
            "max_bytes": self._max_frame_bytes,
            "parts": True,
        }
        sent_at = self.clocks.now()
        await socket.send(orjson.dumps(challenge))
        try:
            hello = _frame(await socket.receive(), "hello", socket)
            received_at = self.clocks.now()
            peer = int(hello["twin"])
        except (LinkClosed, KeyError, TypeError, ValueError) as exc:
            raise _Refused(f"no valid hello: {exc}") from exc
        try:
            twin = await self._resolver.get_twin(peer)
        except ResolverError as exc:
            raise _Refused(f"couldn't get twin {peer} public key: {exc}") from exc
        await self._checking.take()
        try:
            digest = handshake_digest(peer, self._twin, nonce)
            verify_digest(str(hello.get("sig", "")), digest, twin.public_key)
        except SignatureError as exc:
            raise _Refused(f"not signed by twin {peer}: {exc.message}") from exc
        their_nonce = str(hello.get("nonce", ""))
        peer_time_s = read_stamp(hello, peer, self._twin, nonce, twin.public_key)
        if peer_time_s is not None:
            self.clocks.measured_on_link(peer, peer_time_s, sent_at, received_at)
        sig = self._signer.sign_digest(handshake_digest(self._twin, peer, their_nonce)).hex()
        welcome = {
            "op": "welcome",
            "sig": sig,
            **stamp(self._signer, self._twin, peer, their_nonce, self.clocks.now()),
        }
        await socket.send(orjson.dumps(welcome))
        uplink = hello.get("uplink") is True
        return peer, _max_bytes(hello, self._max_frame_bytes), uplink, hello.get("parts") is True


class _Refused(Exception):
    """A handshake this site refuses; the message is the close reason."""


def _max_bytes(frame: dict[str, Any], default: int) -> int:
    value = frame.get("max_bytes")
    return value if isinstance(value, int) and value > 0 else default


def _frame(data: bytes | None, op: str, socket: Socket) -> dict[str, Any]:
    if data is None:
        raise LinkClosed(socket.close_reason(), refused=socket.refused())
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LinkClosed(f"expected {op}, got something unreadable", refused=True) from exc
    if not isinstance(frame, dict) or frame.get("op") != op:
        raise LinkClosed(f"expected {op}", refused=True)
    return frame
