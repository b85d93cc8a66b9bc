"""Framed persistent streams between real peers (hivemind p2pd on 127.0.0.1): 1000 frames echoed intact
and in order, concurrent clients, authenticated remote peer id, oversized frames, close and death of the
other side, ping. Nothing here is timed: scripts/bench_p2p.py measures the round trip."""

from __future__ import annotations

import asyncio
import math

import pytest

from swarm.dht.node import SwarmDHT
from swarm.errors import PeerTimeout, ProtocolError
from swarm.p2p import PeerUnreachable, StreamClosed, FramedStream

ECHO = "/test/echo/1"
WHOAMI = "/test/whoami/1"
SMALL = "/test/small/1"
TRACKED = "/test/tracked/1"
FRAME_BYTES = 2304  # one SmolLM2 hidden state: 576 float32


class Server:
    """A serving node plus what its handlers observed."""

    def __init__(self, node: SwarmDHT):
        self.node = node
        self.exited = asyncio.Event()
        self.errors: list[BaseException] = []

    async def echo(self, stream: FramedStream) -> None:
        while True:
            await stream.send(await stream.recv())

    async def whoami(self, stream: FramedStream) -> None:
        await stream.send(stream.remote_peer_id.encode())
        while True:
            await stream.send(await stream.recv())

    async def small(self, stream: FramedStream) -> None:
        try:
            while True:
                await stream.send(await stream.recv())
        except ProtocolError as e:
            self.errors.append(e)
            raise

    async def tracked(self, stream: FramedStream) -> None:
        try:
            while True:
                await stream.send(await stream.recv())
        except StreamClosed:
            self.exited.set()


@pytest.fixture(scope="module")
def peers(loop, tmp_path_factory):
    """A server S serving the test protocols and two clients C1, C2 joined through it."""

    async def start():
        s = await SwarmDHT.start(data_dir=tmp_path_factory.mktemp("s"))
        server = Server(s)
        await s.transport.serve(ECHO, server.echo)
        await s.transport.serve(WHOAMI, server.whoami)
        await s.transport.serve(SMALL, server.small, max_frame_bytes=1024)
        await s.transport.serve(TRACKED, server.tracked)
        c1 = await SwarmDHT.start(s.visible_maddrs(), data_dir=tmp_path_factory.mktemp("c1"))
        c2 = await SwarmDHT.start(s.visible_maddrs(), data_dir=tmp_path_factory.mktemp("c2"))
        return server, c1, c2

    server, c1, c2 = loop.run_until_complete(start())
    yield server, c1, c2
    for node in (c2, c1, server.node):
        loop.run_until_complete(node.shutdown())


def test_1000_frames_echo_intact_and_in_order_on_one_stream(loop, peers):
    server, c1, _ = peers

    def frame(i: int) -> bytes:
        return i.to_bytes(4, "little") * (FRAME_BYTES // 4)

    async def run() -> list[bytes]:
        replies = []
        async with await c1.transport.open_stream(
            server.node.peer_id, server.node.visible_maddrs(), ECHO
        ) as stream:
            for i in range(1000):
                await stream.send(frame(i))
                replies.append(await stream.recv(timeout_s=10))
        return replies

    replies = loop.run_until_complete(run())
    assert [i for i, r in enumerate(replies) if r != frame(i)] == []


def test_two_clients_concurrently_and_remote_peer_id(loop, peers):
    server, c1, c2 = peers

    async def client(node: SwarmDHT, tag: bytes) -> bytes:
        async with await node.transport.open_stream(
            server.node.peer_id, server.node.visible_maddrs(), WHOAMI
        ) as stream:
            seen_as = await stream.recv(timeout_s=10)
            for i in range(200):
                frame = tag + i.to_bytes(4, "little") * 500
                await stream.send(frame)
                assert await stream.recv(timeout_s=10) == frame
            return seen_as

    async def both() -> list[bytes]:
        return await asyncio.gather(client(c1, b"one"), client(c2, b"two"))

    seen1, seen2 = loop.run_until_complete(both())
    assert seen1.decode() == c1.peer_id
    assert seen2.decode() == c2.peer_id
    assert c1.peer_id != c2.peer_id


def test_oversized_frame_closes_only_that_stream(loop, peers):
    server, c1, c2 = peers

    async def run() -> None:
        stream = await c1.transport.open_stream(server.node.peer_id, (), SMALL)
        await stream.send(b"x" * 1000)
        assert await stream.recv(timeout_s=10) == b"x" * 1000
        await stream.send(b"y" * 4096)  # within the client's limit, over the server's 1024
        with pytest.raises(PeerUnreachable):
            await stream.recv(timeout_s=10)
        assert stream.closed
        # the server keeps serving other streams of the same protocol
        async with await c2.transport.open_stream(server.node.peer_id, (), SMALL) as other:
            await other.send(b"z" * 10)
            assert await other.recv(timeout_s=10) == b"z" * 10

    loop.run_until_complete(run())
    assert len(server.errors) == 1 and "4096" in str(server.errors[0])


def test_oversized_send_is_refused_on_the_sender(loop, peers):
    server, c1, _ = peers

    async def run() -> FramedStream:
        stream = await c1.transport.open_stream(server.node.peer_id, (), ECHO, max_frame_bytes=100)
        with pytest.raises(ProtocolError):
            await stream.send(b"a" * 101)
        return stream

    assert loop.run_until_complete(run()).closed


def test_client_close_ends_the_handler(loop, peers):
    server, c1, _ = peers

    async def run() -> None:
        stream = await c1.transport.open_stream(server.node.peer_id, (), TRACKED)
        await stream.send(b"hello")
        assert await stream.recv(timeout_s=10) == b"hello"
        assert not server.exited.is_set()
        await stream.close()
        await asyncio.wait_for(server.exited.wait(), timeout=30)  # the handler saw StreamClosed

    loop.run_until_complete(run())


def test_ping_and_unreachable_errors(loop, peers):
    server, c1, _ = peers
    rtt_ms = loop.run_until_complete(c1.transport.ping(server.node.peer_id, server.node.visible_maddrs()))
    assert math.isfinite(rtt_ms) and rtt_ms > 0.0  # a measured round trip in ms
    with pytest.raises(PeerUnreachable):
        loop.run_until_complete(c1.transport.open_stream(server.node.peer_id, (), "/test/not-served/1"))
    with pytest.raises(ProtocolError):
        loop.run_until_complete(c1.transport.open_stream("not-a-peer-id!", (), ECHO))
    with pytest.raises(ProtocolError):
        loop.run_until_complete(c1.transport.open_stream(server.node.peer_id, ["/ip4/nonsense"], ECHO))


def test_a_ping_carries_the_responders_wall_time(loop, peers):
    """Both nodes run on this machine's one clock: the offset is within half the round trip (plus
    float rounding)."""
    server, c1, _ = peers
    probing = c1.transport.probe(server.node.peer_id, server.node.visible_maddrs())
    rtt_ms, clock = loop.run_until_complete(probing)
    assert rtt_ms > 0.0 and clock is not None
    assert abs(clock.offset_s) <= clock.rtt_s / 2 + 1e-3


def test_peer_dying_mid_stream_is_a_clear_error(loop, tmp_path):
    async def run() -> None:
        doomed = await SwarmDHT.start(data_dir=tmp_path / "doomed")
        client = await SwarmDHT.start(doomed.visible_maddrs(), data_dir=tmp_path / "client")
        got_frame = asyncio.Event()
        try:

            async def silent(stream: FramedStream) -> None:
                await stream.recv()
                got_frame.set()
                await asyncio.Event().wait()  # never answers

            await doomed.transport.serve(ECHO, silent)
            stream = await client.transport.open_stream(doomed.peer_id, doomed.visible_maddrs(), ECHO)
            await stream.send(b"are you there")
            waiting = asyncio.create_task(stream.recv(timeout_s=60))
            await asyncio.wait_for(got_frame.wait(), timeout=30)
            await doomed.shutdown()
            with pytest.raises(PeerUnreachable) as err:
                await waiting
            # the read ended because the stream died, not because its own 60 s timeout ran out
            assert not isinstance(err.value, PeerTimeout), err.value
            with pytest.raises(PeerUnreachable):
                await client.transport.open_stream(doomed.peer_id, doomed.visible_maddrs(), ECHO)
        finally:
            await client.shutdown()

    loop.run_until_complete(run())
