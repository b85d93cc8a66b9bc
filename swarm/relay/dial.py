"""A client's (or pushing peer's) stream to a peer through one of its relays, and a relayed ping.

`dial` connects to a relay address the peer announced, asks for the peer, and runs the end-to-end
handshake (swarm.relay.handshake) as initiator: the stream it returns is sealed like a direct one
and its `remote_peer_id` was proven by the peer itself, not by the relay.

This module does not choose between transports (swarm.client.streams and swarm.peer.server do).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from swarm.errors import PeerTimeout, PeerUnreachable, ProtocolError
from swarm.limits import MAX_FRAME_BYTES, PING_PROTOCOL
from swarm.p2p import FramedStream
from swarm.relay.handshake import MAX_HANDSHAKE_BYTES, RelayIdentity, initiate
from swarm.relay.records import MAX_MESSAGE_BYTES, decode_message, encode_message, parse_relay_addr

DIAL_TIMEOUT_S = 5.0
"""One relay's TCP connect gives up after this long (then the next relay address is tried)."""


class RelayRefused(PeerUnreachable):
    """A relay refused to connect to the peer (not registered there, or over its budget: BUSY)."""


async def dial(identity: RelayIdentity, relay_addrs: Iterable[str], peer_id: str, protocol: str,
               timeout_s: float) -> FramedStream:
    """A sealed stream to `peer_id` for `protocol` through the first of its relays that connects.

    Args:
        identity: this side's credentials (its peer id is what the peer sees as the client).
        relay_addrs: the peer's announced relay addresses (swarm.relay.records.relay_addr), in order.
        peer_id: the peer to reach.
        protocol: the stream protocol to speak.
        timeout_s: the whole setup's bound.
    Returns:
        an open FramedStream (close it) whose frames are sealed end to end.
    Raises:
        RelayRefused: every relay answered, and refused (the reasons are in the message).
        PeerUnreachable: no relay address usable or answering.
        ProtocolError: the relayed end is not `peer_id`, or the handshake was tampered with.
        PeerTimeout: not set up within timeout_s.
    """
    targets = [t for t in map(parse_relay_addr, relay_addrs) if t is not None]
    if not targets:
        raise PeerUnreachable(f"peer {peer_id[:12]}… announces no usable relay address")
    errors, refused = [], True
    try:
        async with asyncio.timeout(timeout_s):
            for host, port, relay in targets:
                try:
                    async with asyncio.timeout(DIAL_TIMEOUT_S):
                        reader, writer = await asyncio.open_connection(host, port)
                except (OSError, TimeoutError) as e:
                    errors.append(f"relay {relay[:12]}… at {host}:{port}: {e or 'no answer'}")
                    refused = False
                    continue
                hello = FramedStream(peer_id, protocol, reader, writer, max(MAX_MESSAGE_BYTES, MAX_HANDSHAKE_BYTES))
                try:
                    await hello.send(encode_message("connect", peer=peer_id))
                    answer = decode_message(await hello.recv(timeout_s), "connected", "refused")
                    if answer["op"] == "refused":
                        errors.append(f"relay {relay[:12]}… refused: {answer['why']}")
                        await hello.close()
                        continue
                    cipher = await initiate(hello, identity, peer_id, protocol)
                except BaseException:
                    await hello.close()
                    raise
                return FramedStream(peer_id, protocol, reader, writer, MAX_FRAME_BYTES, cipher=cipher)
    except TimeoutError:
        raise PeerTimeout(f"relayed stream to {peer_id[:12]}… not set up within {timeout_s:.1f} s") from None
    kind = RelayRefused if refused else PeerUnreachable
    raise kind(f"no relay of {peer_id[:12]}… connected: {'; '.join(errors)}")


async def ping(identity: RelayIdentity, relay_addrs: Iterable[str], peer_id: str, *, rounds: int = 3,
               timeout_s: float = 5.0) -> float:
    """Round trip to `peer_id` through its relay, ms: the fastest of `rounds` echoes on one relayed
    stream (its setup not counted). The peer serves PING_PROTOCOL on relayed streams.

    Raises:
        PeerUnreachable: no relayed stream, or a wrong or missing echo.
    """
    try:
        stream = await dial(identity, relay_addrs, peer_id, PING_PROTOCOL, timeout_s)
    except ProtocolError as e:
        raise PeerUnreachable(str(e)) from e
    async with stream:
        best_s = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            await stream.send(b"swarmping")
            reply = await stream.recv(timeout_s)
            best_s = min(best_s, time.perf_counter() - t0)
            if reply != b"swarmping":
                raise PeerUnreachable(f"{peer_id} answered a relayed ping with {len(reply)} wrong bytes")
    return best_s * 1000.0
