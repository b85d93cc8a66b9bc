"""Direct TCP streams between a client and a peer, set up and authenticated over libp2p.

A hop's round trip through the two p2pd daemons costs ~0.5 ms more than over a plain TCP connection
between the two processes (docs/benchmarks.md, "Per-hop cost"), on every decode step of every hop.
So a peer also listens on TCP and announces those endpoints (`Announcement.direct_addrs`); libp2p
stays how peers are found, how the connection is authorised, and the fallback when a dial fails.

Setup (one per hop and session):
1. The client opens an authenticated libp2p stream for DIRECT_PROTOCOL and names the protocol it
   wants (today SPAN_PROTOCOL). The peer answers a one-time ticket (16 bytes) and a fresh 256-bit
   key, both random, bound to the client's libp2p peer id; the ticket expires after TICKET_TTL_S.
2. The client dials an announced endpoint and sends the ticket as its first frame. The peer redeems
   it (once) and from then on treats the connection as a stream from that peer id.
3. Every later frame, both ways, is sealed with ChaCha20-Poly1305 (RFC 8439) under the key, the nonce
   being the direction and a frame counter: a frame that is altered, dropped, replayed or reordered
   does not open, and the stream ends with ProtocolError. Only the two ends know the key (it crossed
   libp2p's encrypted stream), so the stream is as authenticated as a libp2p one.

The framing is swarm.p2p's (`FramedStream` with a `FrameCipher`), so stream handlers cannot tell a
direct stream from a libp2p one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from swarm.errors import AddressError, PeerTimeout, PeerUnreachable, ProtocolError, SwarmError
from swarm.limits import DIRECT_PROTOCOL, MAX_FRAME_BYTES
from swarm.netaddr import maddr_host_port
from swarm.p2p import StreamHandler, FramedStream, SwarmP2P

logger = logging.getLogger(__name__)

"""libp2p protocol on which a client asks a peer for a direct-connection ticket."""
TICKET_BYTES = 16
KEY_BYTES = 32
TICKET_TTL_S = 30.0
"""A ticket not redeemed within this many seconds is void."""
MAX_TICKETS = 4096
"""Outstanding tickets a peer keeps; past it the oldest is dropped (bounds memory per asker)."""
HELLO_TIMEOUT_S = 5.0
"""An accepted connection must present its ticket within this many seconds."""
DIAL_TIMEOUT_S = 2.0
"""A client gives up dialling one endpoint after this long and falls back to libp2p."""
_MAX_PROTOCOL_CHARS = 64
_TAG_BYTES = 16
_NONCE = struct.Struct(">4sQ")
_TO_PEER, _TO_CLIENT = b"c>s\0", b"s>c\0"


class AeadFrameCipher:
    """ChaCha20-Poly1305 over the frames of one stream, in order (a `swarm.p2p.FrameCipher`).

    Args:
        key: 32 bytes shared by the two ends.
        initiator: True on the side that dialled (the client).
    The nonce of frame i in one direction is (direction tag, i): each key seals each nonce once.
    """

    overhead = _TAG_BYTES

    def __init__(self, key: bytes, initiator: bool):
        if len(key) != KEY_BYTES:
            raise ProtocolError(f"a direct-stream key has {KEY_BYTES} bytes, got {len(key)}")
        self._aead = ChaCha20Poly1305(key)
        self._send_dir, self._recv_dir = (_TO_PEER, _TO_CLIENT) if initiator else (_TO_CLIENT, _TO_PEER)
        self._sent = self._received = 0

    def seal(self, frame: bytes) -> bytes:
        """The next frame to send, encrypted, with its 16-byte tag appended."""
        nonce = _NONCE.pack(self._send_dir, self._sent)
        self._sent += 1
        return self._aead.encrypt(nonce, frame, None)

    def open(self, sealed: bytes) -> bytes:
        """The next received frame, decrypted.

        Raises:
            ProtocolError: the frame was altered, replayed, reordered, or sealed under another key.
        """
        nonce = _NONCE.pack(self._recv_dir, self._received)
        try:
            frame = self._aead.decrypt(nonce, sealed, None)
        except InvalidTag:
            raise ProtocolError(f"direct frame {self._received} failed authentication") from None
        self._received += 1
        return frame


@dataclass(frozen=True)
class Ticket:
    """A ticket the peer issued: whom it admits, for what, with which key, until when.

    Attributes:
        peer_id: the libp2p peer id that asked for it.
        protocol: the stream protocol the connection will speak.
        key: the stream's 32-byte key.
        expires_s: void after this time, seconds on the issuer's clock.
    """

    peer_id: str
    protocol: str
    key: bytes
    expires_s: float


class TicketBook:
    """Outstanding one-time tickets of one peer (pure: the caller passes the time).

    Args:
        ttl_s: a ticket's life in seconds.
        max_tickets: most tickets outstanding; issuing past it drops the oldest.
    """

    def __init__(self, ttl_s: float = TICKET_TTL_S, max_tickets: int = MAX_TICKETS):
        self._ttl_s, self._max = ttl_s, max_tickets
        self._tickets: OrderedDict[bytes, Ticket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, peer_id: str, protocol: str, now_s: float) -> tuple[bytes, bytes]:
        """A new (ticket, key) for `peer_id` speaking `protocol`."""
        while self._tickets and (
            len(self._tickets) >= self._max or next(iter(self._tickets.values())).expires_s <= now_s
        ):
            self._tickets.popitem(last=False)
        ticket, key = secrets.token_bytes(TICKET_BYTES), secrets.token_bytes(KEY_BYTES)
        self._tickets[ticket] = Ticket(peer_id, protocol, key, now_s + self._ttl_s)
        return ticket, key

    def redeem(self, ticket: bytes, now_s: float) -> Ticket | None:
        """The ticket's grant, once; None when unknown, already redeemed or expired."""
        grant = self._tickets.pop(ticket, None)
        return grant if grant is not None and grant.expires_s > now_s else None


class DirectServer:
    """A peer's TCP listener for direct streams, and its ticket office on libp2p.

    `listen` binds the port (early, so that a port in use fails before anything else starts); `open`
    starts issuing tickets. Until then every connection is closed unheard (no ticket can be valid).
    """

    def __init__(self):
        self._transport: SwarmP2P | None = None
        self._handlers: dict[str, StreamHandler] = {}
        self._book = TicketBook()
        self._server: asyncio.AbstractServer | None = None
        self._nonces: dict[bytes, asyncio.Future[None]] = {}  # dial-back probes awaited (swarm.reach)

    async def listen(self, host: str, port: int = 0) -> int:
        """Listen on host:port (0: any free port). Returns the port.

        Raises:
            AddressError: the port cannot be bound (in use, or not permitted).
        """
        try:
            self._server = await asyncio.start_server(self._accept, host, port)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)  # asyncio's own strerror repeats the address
            raise AddressError(f"--direct-port {port}: cannot listen on {host}: {why}") from e
        return self._server.sockets[0].getsockname()[1]

    async def open(self, transport: SwarmP2P, handlers: dict[str, StreamHandler]) -> None:
        """Issue tickets on `transport` for `handlers` (protocol name → stream handler, the protocols
        that may be reached directly); the streams run under `transport`, whose `close` ends them."""
        self._transport, self._handlers = transport, dict(handlers)
        await transport.serve(DIRECT_PROTOCOL, self._issue, max_frame_bytes=_MAX_PROTOCOL_CHARS)

    def expect_nonce(self, nonce: bytes) -> asyncio.Future[None]:
        """A future done when a connection presents `nonce` (TICKET_BYTES long) as its first frame: a
        dial-back probe (swarm.reach) reached this listener. `forget_nonce` it when done."""
        if len(nonce) != TICKET_BYTES:
            raise ValueError(f"a dial-back nonce has {TICKET_BYTES} bytes, got {len(nonce)}")
        return self._nonces.setdefault(nonce, asyncio.get_running_loop().create_future())

    def forget_nonce(self, nonce: bytes) -> None:
        """Stop awaiting `nonce` (its probe ended)."""
        self._nonces.pop(nonce, None)

    async def close(self) -> None:
        """Stop accepting; running streams end with the transport's `close`."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _issue(self, stream: FramedStream) -> None:
        protocol = (await stream.recv(HELLO_TIMEOUT_S)).decode("ascii", "replace")
        if protocol not in self._handlers:
            raise ProtocolError(f"no direct streams for protocol {protocol[:_MAX_PROTOCOL_CHARS]!r}")
        now = asyncio.get_running_loop().time()
        ticket, key = self._book.issue(stream.remote_peer_id, protocol, now)
        await stream.send(ticket + key)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            # The peer is closing (SwarmP2P.close cancels every handler). This is the connection's
            # own task, started by asyncio.start_server, and asyncio (3.11) logs a cancelled one as
            # an error with a traceback: end it normally instead.
            writer.close()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = FramedStream("(unauthenticated)", DIRECT_PROTOCOL, reader, writer, TICKET_BYTES)
        try:
            ticket = await hello.recv(HELLO_TIMEOUT_S)
        except SwarmError as e:
            logger.debug("direct connection from %s dropped before its ticket: %s",
                         writer.get_extra_info("peername"), e)
            await hello.close()
            return
        probe = self._nonces.pop(ticket, None)
        if probe is not None:  # a dial-back, not a client: it proved reachability and is done
            if not probe.done():
                probe.set_result(None)
            await hello.close()
            return
        grant = self._book.redeem(ticket, asyncio.get_running_loop().time())
        if grant is None or self._transport is None:
            logger.info("direct connection from %s refused: unknown, used or expired ticket",
                        writer.get_extra_info("peername"))
            await hello.close()
            return
        session = FramedStream(grant.peer_id, grant.protocol, reader, writer, MAX_FRAME_BYTES,
                                cipher=AeadFrameCipher(grant.key, initiator=False))
        await self._transport.run_handler(self._handlers[grant.protocol], session)


def direct_maddrs(hosts: Iterable[str], port: int) -> tuple[str, ...]:
    """The multiaddrs of a direct listener on `port` at each of `hosts` (IP literals)."""
    return tuple(f"/ip6/{h}/tcp/{port}" if ":" in h else f"/ip4/{h}/tcp/{port}" for h in hosts)


async def dial(
    transport: SwarmP2P,
    peer_id: str,
    addrs: Iterable[str],
    endpoints: Iterable[str],
    protocol: str,
    timeout_s: float,
    progress: list[str] | None = None,
) -> FramedStream:
    """Open a direct stream to `peer_id` for `protocol`: a ticket over libp2p, then TCP.

    Args:
        transport: the client's libp2p transport.
        peer_id: the peer to reach.
        addrs: its libp2p multiaddrs (for the ticket request).
        endpoints: its announced direct multiaddrs, dialled at once, the first to connect used.
        protocol: the stream protocol to speak (the peer must offer it directly).
        timeout_s: the whole setup's bound; one endpoint's dial is bounded by DIAL_TIMEOUT_S too.
        progress: where the setup is, appended as it goes ("ticket", "dialling HOST:PORT, ..."), so
            that a caller who abandons the dial can say what it was waiting for.
    Returns:
        an open FramedStream whose frames are sealed (close it).
    Raises:
        PeerUnreachable: no ticket, or no endpoint accepted a connection; the text names each
            endpoint and its cause (fall back to libp2p).
        PeerTimeout: the setup took over timeout_s.
    """
    progress = [] if progress is None else progress
    targets = [hp for hp in map(maddr_host_port, endpoints) if hp is not None]
    if not targets:
        raise PeerUnreachable(f"peer {peer_id[:12]}… announces no usable direct endpoint")
    try:
        async with asyncio.timeout(timeout_s):
            progress.append("asking for a ticket over libp2p")
            async with await transport.open_stream(peer_id, addrs, DIRECT_PROTOCOL, max_frame_bytes=64) as s:
                await s.send(protocol.encode("ascii"))
                grant = await s.recv(timeout_s)
            if len(grant) != TICKET_BYTES + KEY_BYTES:
                raise PeerUnreachable(f"peer {peer_id[:12]}… answered a ticket of {len(grant)} bytes")
            ticket, key = grant[:TICKET_BYTES], grant[TICKET_BYTES:]
            progress.append("dialling " + ", ".join(f"{h}:{p}" for h, p in targets))
            reader, writer = await _connect_first(peer_id, targets)
    except TimeoutError:
        raise PeerTimeout(f"direct stream to {peer_id[:12]}… not set up within {timeout_s:.1f} s "
                          f"({progress[-1]})") from None
    hello = FramedStream(peer_id, protocol, reader, writer, TICKET_BYTES)
    await hello.send(ticket)
    return FramedStream(peer_id, protocol, reader, writer, MAX_FRAME_BYTES,
                         cipher=AeadFrameCipher(key, initiator=True))


async def _connect_first(peer_id: str, targets: list[tuple[str, int]]):
    """(reader, writer) of the first of `targets` to accept a TCP connection, each dial bounded by
    DIAL_TIMEOUT_S; the others are cancelled or closed.

    Raises:
        PeerUnreachable: none connected; the text names each endpoint and why.
    """

    async def connect(host: str, port: int):
        try:
            async with asyncio.timeout(DIAL_TIMEOUT_S):
                return await asyncio.open_connection(host, port)
        except TimeoutError:
            raise PeerUnreachable(f"timed out after {DIAL_TIMEOUT_S:.1f} s dialling {host}:{port}") from None
        except OSError as e:
            raise PeerUnreachable(f"{dial_error_words(e)} dialling {host}:{port}") from None

    tasks = [asyncio.create_task(connect(h, p)) for h, p in targets]
    errors: list[str] = []
    winner = None
    try:
        for next_done in asyncio.as_completed(tasks):
            try:
                winner = await next_done
                return winner
            except PeerUnreachable as e:
                errors.append(str(e))
    finally:
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, tuple) and result is not winner:
                result[1].close()  # another endpoint that connected too
    raise PeerUnreachable(f"no direct endpoint of {peer_id[:12]}… answered: {'; '.join(errors)}")


async def tcp_answers(endpoints: Iterable[str], timeout_s: float) -> bool:
    """Whether one of these direct endpoints accepts a TCP connection within timeout_s (closed at
    once, before any ticket): the reachability check of `swarm status`."""
    targets = [hp for hp in map(maddr_host_port, endpoints) if hp is not None]
    if not targets:
        return False
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await _connect_first("(check)", targets)
    except (PeerUnreachable, TimeoutError):
        return False
    writer.close()
    return True


def dial_error_words(e: OSError) -> str:
    """The cause of a failed TCP dial in words ("Connection refused"), never empty."""
    return os.strerror(e.errno) if e.errno else (str(e) or type(e).__name__)
