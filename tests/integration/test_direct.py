"""Direct TCP streams (swarm.direct) between real nodes on 127.0.0.1: a ticket over libp2p, then
sealed frames over TCP. What a handler sees (frames intact, the client's authenticated peer id), and
what never reaches it: unknown or reused tickets, altered frames, protocols not offered."""

from __future__ import annotations

import asyncio
import struct

import pytest

from swarm.dht.node import SwarmDHT
from swarm.direct import TICKET_BYTES, AeadFrameCipher, DirectServer, dial, direct_maddrs
from swarm.errors import PeerUnreachable, ProtocolError, SwarmError
from swarm.p2p import FramedStream

ECHO = "/test/direct-echo/1"
HEADER = struct.Struct(">I")


class Observed:
    """What the echo handler saw."""

    def __init__(self):
        self.peers: list[str] = []
        self.frames: list[bytes] = []
        self.errors: list[BaseException] = []

    async def echo(self, stream: FramedStream) -> None:
        self.peers.append(stream.remote_peer_id)
        try:
            while True:
                frame = await stream.recv()
                self.frames.append(frame)
                await stream.send(frame)
        except ProtocolError as e:
            self.errors.append(e)
            raise


@pytest.fixture(scope="module")
def nodes(loop, tmp_path_factory):
    """A serving node with a direct listener for ECHO, and a client node."""
    tmp = tmp_path_factory.mktemp("direct")
    seen = Observed()

    async def start():
        server = await SwarmDHT.start(data_dir=tmp / "server")
        direct = DirectServer()
        port = await direct.listen("127.0.0.1", 0)
        await direct.open(server.transport, {ECHO: seen.echo})
        client = await SwarmDHT.start(server.visible_maddrs(), data_dir=tmp / "client")
        return server, direct, client, direct_maddrs(["127.0.0.1"], port)

    server, direct, client, endpoints = loop.run_until_complete(start())
    yield server, client, endpoints, seen
    loop.run_until_complete(direct.close())
    loop.run_until_complete(client.shutdown())
    loop.run_until_complete(server.shutdown())


async def ticket_for(client: SwarmDHT, server: SwarmDHT, protocol: str = ECHO) -> tuple[bytes, bytes]:
    """Ask for a ticket the way `dial` does, without connecting."""
    from swarm.limits import DIRECT_PROTOCOL

    target = (server.peer_id, server.visible_maddrs())
    async with await client.transport.open_stream(*target, DIRECT_PROTOCOL) as s:
        await s.send(protocol.encode())
        grant = await s.recv(10)
    return grant[:TICKET_BYTES], grant[TICKET_BYTES:]


async def raw_exchange(port: int, first: bytes, then: bytes | None = None, replies: int = 0) -> bytes:
    """Connect, send `first` (and `then`) as frames; return `replies` frames read back, or with
    replies=0 whatever comes back until the peer closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEADER.pack(len(first)) + first)
    if then is not None:
        writer.write(HEADER.pack(len(then)) + then)
    await writer.drain()
    try:
        if replies == 0:
            return await asyncio.wait_for(reader.read(), 10)
        (length,) = HEADER.unpack(await asyncio.wait_for(reader.readexactly(4), 10))
        return await reader.readexactly(length)
    finally:
        writer.close()


def port_of(endpoints) -> int:
    return int(endpoints[0].rsplit("/", 1)[1])


def test_frames_cross_intact_and_the_handler_knows_the_client(loop, nodes):
    server, client, endpoints, seen = nodes

    async def run():
        stream = await dial(client.transport, server.peer_id, server.visible_maddrs(), endpoints, ECHO, 10)
        async with stream:
            for i in range(200):
                frame = bytes([i % 256]) * (2304 + i)
                await stream.send(frame)
                assert await stream.recv(10) == frame
        return stream

    stream = loop.run_until_complete(run())
    assert stream.cipher is not None
    assert seen.peers[-1] == client.peer_id  # bound by the ticket asked for over libp2p
    assert len(seen.frames) >= 200


def test_an_unknown_ticket_never_reaches_the_handler(loop, nodes):
    server, client, endpoints, seen = nodes
    n_before = len(seen.peers)
    got = loop.run_until_complete(raw_exchange(port_of(endpoints), bytes(TICKET_BYTES)))
    assert got == b""  # closed without a word
    assert len(seen.peers) == n_before


def test_a_ticket_admits_one_connection(loop, nodes):
    server, client, endpoints, seen = nodes

    async def run():
        ticket, key = await ticket_for(client, server)
        sealed = AeadFrameCipher(key, initiator=True).seal(b"hello")
        first = await raw_exchange(port_of(endpoints), ticket, sealed, replies=1)
        second = await raw_exchange(port_of(endpoints), ticket, sealed)
        return key, first, second

    n_before = len(seen.peers)
    key, first, second = loop.run_until_complete(run())
    assert AeadFrameCipher(key, initiator=True).open(first) == b"hello"  # the echo, sealed back
    assert second == b""  # the same ticket again: closed without a word
    assert len(seen.peers) == n_before + 1


def test_an_altered_frame_ends_the_stream_unread(loop, nodes):
    server, client, endpoints, seen = nodes

    async def run():
        ticket, key = await ticket_for(client, server)
        sealed = bytearray(AeadFrameCipher(key, initiator=True).seal(b"forward: 2304 bytes of hidden state"))
        sealed[3] ^= 0x80
        return await raw_exchange(port_of(endpoints), ticket, bytes(sealed))

    n_frames, n_errors = len(seen.frames), len(seen.errors)
    assert loop.run_until_complete(run()) == b""
    assert len(seen.frames) == n_frames  # the handler never got the altered frame
    assert len(seen.errors) == n_errors + 1 and "authentication" in str(seen.errors[-1])


def test_a_key_from_another_ticket_does_not_open(loop, nodes):
    server, client, endpoints, seen = nodes

    async def run():
        ticket, _ = await ticket_for(client, server)
        _, other_key = await ticket_for(client, server)
        return await raw_exchange(port_of(endpoints), ticket, AeadFrameCipher(other_key, True).seal(b"hi"))

    n_frames = len(seen.frames)
    assert loop.run_until_complete(run()) == b""
    assert len(seen.frames) == n_frames


def test_a_protocol_not_offered_directly_gets_no_ticket(loop, nodes):
    server, client, endpoints, _ = nodes
    with pytest.raises(PeerUnreachable):
        loop.run_until_complete(
            dial(client.transport, server.peer_id, server.visible_maddrs(), endpoints, "/test/other/1", 10)
        )


def test_no_listening_endpoint_is_unreachable_not_a_hang(loop, nodes):
    server, client, _, _ = nodes
    with pytest.raises(PeerUnreachable, match="no direct endpoint"):
        loop.run_until_complete(
            dial(client.transport, server.peer_id, server.visible_maddrs(), ["/ip4/127.0.0.1/tcp/1"], ECHO, 9)
        )
    with pytest.raises(SwarmError, match="no usable direct endpoint"):
        loop.run_until_complete(
            dial(client.transport, server.peer_id, server.visible_maddrs(), ["/dns/x.org/tcp/1"], ECHO, 9)
        )
