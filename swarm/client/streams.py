"""The `HopTransport` of the swarm client: span streams to peers, direct TCP, relayed, or libp2p.

A `P2PLink` is the `HopLink` (swarm/client/link.py) over one framed stream: frames encoded with
swarm.wire, length-prefixed by swarm.p2p. `P2PTransport` opens a relayed stream to a peer that
announces relay addresses (it cannot be dialled: swarm.relay), else a direct stream where the peer
announces one (swarm.direct), and falls back to libp2p, remembering for a while whose direct
endpoints did not answer.

This module does not: pair a frame with its answer (the route session does), or read the DHT (the
directory gives the addresses).
"""

from __future__ import annotations

import asyncio
import time

from swarm.client.directory import DHTDirectory
from swarm.dht.node import SwarmDHT
from swarm.dialing import open_stream
from swarm.errors import PeerTimeout, PeerUnreachable, SwarmError
from swarm.limits import SPAN_PROTOCOL
from swarm.p2p import FramedStream
from swarm.relay import dial as relay_dial
from swarm.wire import Close, Error, Frame, decode_frame, encode_frame

CLOSE_TIMEOUT_S = 2.0
"""Saying Close to a peer gives up after this long (a frozen peer frees its cache by itself)."""
DIRECT_RETRY_S = 60.0
"""After a peer's direct endpoints failed, its streams go through libp2p this long before direct is
tried again (sooner when it announces other endpoints)."""


class P2PLink:
    """`HopLink` over one framed stream (libp2p, or direct TCP: swarm.direct), frames encoded with
    swarm.wire and length-prefixed by swarm.p2p."""

    def __init__(self, peer_id: str, stream: FramedStream, transport: str = "libp2p",
                 direct_error: str = ""):
        self.peer_id, self._stream, self.transport = peer_id, stream, transport
        self.direct_error = direct_error
        self._said: bytes | None = None  # a peer's last words, read after a failed send

    async def send(self, frame: Frame, timeout_s: float) -> int:
        """Send one frame; its bytes on the wire (see `HopLink.send`). A peer that hung up after
        saying why (an Error, e.g. SHUTTING_DOWN) is read by the next `recv`."""
        data = encode_frame(frame)
        try:
            async with asyncio.timeout(timeout_s):
                await self._stream.send(data)
        except TimeoutError:
            await self._stream.close()
            raise PeerTimeout(
                f"peer {self.peer_id[:12]}… took over {timeout_s:.1f} s to accept a frame"
            ) from None
        except PeerUnreachable:
            # A peer that leaves says why (SHUTTING_DOWN) before hanging up: report that, not "broken".
            said = await self._stream.last_words()
            if said is not None and isinstance(decode_frame(said), Error):
                self._said = said
                return len(data) + 4
            raise
        return len(data) + 4

    async def recv(self, timeout_s: float) -> tuple[Frame, int]:
        """The next frame from the peer and its bytes (see `HopLink.recv`)."""
        if self._said is not None:
            said, self._said = self._said, None
            return decode_frame(said), len(said) + 4
        data = await self._stream.recv(timeout_s)
        return decode_frame(data), len(data) + 4

    async def close(self) -> None:
        """Send Close (bounded by CLOSE_TIMEOUT_S) and close the stream; never raises."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._stream.send(encode_frame(Close()))
        except (SwarmError, TimeoutError):
            pass
        await self._stream.close()


class P2PTransport:
    """`HopTransport`: a relayed stream to a peer behind a relay (swarm.relay), a direct TCP stream
    where the peer offers one (swarm.direct), else a stream through the client's libp2p daemon,
    dialling the addresses the directory saw.

    Attributes:
        direct: try direct streams at all (False: libp2p only, e.g. to compare the two).
    """

    def __init__(self, dht: SwarmDHT, directory: DHTDirectory, direct: bool = True):
        self._dht, self._directory, self.direct = dht, directory, direct
        # peer id -> (direct endpoints that did not answer, monotonic time, why): libp2p to that peer
        # for DIRECT_RETRY_S, or until it announces other endpoints
        self._direct_failed: dict[str, tuple[tuple[str, ...], float, str]] = {}

    async def connect(self, peer_id: str, timeout_s: float) -> P2PLink:
        """Open a span stream to `peer_id`, direct when it can. Raises PeerUnreachable, or PeerTimeout
        past timeout_s."""
        relays = self._directory.relay_addrs(peer_id)
        if relays:
            try:
                stream = await relay_dial.dial(self._directory.identity, relays, peer_id, SPAN_PROTOCOL, timeout_s)
                return P2PLink(peer_id, stream, "relayed")
            except PeerUnreachable:
                if not self._directory.addrs(peer_id):
                    raise
        endpoints = self._directory.direct_addrs(peer_id)
        failed = self._direct_failed.get(peer_id)
        recent = (failed is not None and failed[0] == endpoints
                  and time.monotonic() - failed[1] < DIRECT_RETRY_S)
        try_direct = self.direct and bool(endpoints) and not recent
        opened = await open_stream(self._dht.transport, peer_id, self._directory.addrs(peer_id),
                                   endpoints if try_direct else (), SPAN_PROTOCOL, timeout_s)
        if try_direct and opened.kind == "libp2p":
            self._direct_failed[peer_id] = (endpoints, time.monotonic(), opened.direct_error)
        why = opened.direct_error or (failed[2] if recent and self.direct else "")
        return P2PLink(peer_id, opened.stream, opened.kind, why)
