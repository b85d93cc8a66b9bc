"""Relayed streams (swarm.relay) between real nodes on 127.0.0.1: a private node registered with a
relay, a client reaching it through the relay. Bytes cross intact and unlimited in length, the
handler knows the client's peer id, the relay's budget refuses with BUSY, and a private node whose
relay dies registers with another and says so."""

from __future__ import annotations

import asyncio

import pytest

from swarm.dht.node import SwarmDHT
from swarm.direct import direct_maddrs
from swarm.limits import PING_PROTOCOL
from swarm.p2p import FramedStream, answer_pings
from swarm.relay import dial as relay_dial
from swarm.relay.dial import RelayRefused
from swarm.relay.handshake import RelayIdentity
from swarm.relay.registrar import RelayRegistrar
from swarm.relay.rules import RelayLimits
from swarm.relay.service import RelayServer, publish_forever

ECHO = "/test/relay-echo/1"


class Observed:
    """What the private node's echo handler saw."""

    def __init__(self):
        self.peers: list[str] = []
        self.relays: list[tuple[str, ...]] = []
        self.changed = asyncio.Event()

    async def echo(self, stream: FramedStream) -> None:
        self.peers.append(stream.remote_peer_id)
        while True:
            await stream.send(await stream.recv())

    async def on_relay(self, addrs: tuple[str, ...]) -> None:
        self.relays.append(addrs)
        self.changed.set()


async def _relay(dht: SwarmDHT, limits: RelayLimits):
    server = RelayServer(dht.peer_id, limits)
    port = await server.listen("127.0.0.1", 0)
    task = asyncio.ensure_future(publish_forever(dht, server, direct_maddrs(["127.0.0.1"], port), 30.0))
    return server, task


@pytest.fixture(scope="module")
def lab(loop, tmp_path_factory):
    """relay1 (2 connections per peer), a private node registered there, a client; relay2 joins after
    the registration, so the private node can only have chosen relay1."""
    tmp = tmp_path_factory.mktemp("relay")
    seen = Observed()

    async def start():
        r1 = await SwarmDHT.start(data_dir=tmp / "r1")
        relay1 = await _relay(r1, RelayLimits(max_conns_per_peer=2))
        private = await SwarmDHT.start(r1.visible_maddrs(), data_dir=tmp / "private")
        registrar = RelayRegistrar(private, RelayIdentity(private.identity.private_key), private.transport,
                                   {ECHO: seen.echo, PING_PROTOCOL: answer_pings}, seen.on_relay)
        running = asyncio.ensure_future(registrar.run())
        await asyncio.wait_for(registrar.registered.wait(), 60)
        r2 = await SwarmDHT.start(r1.visible_maddrs(), data_dir=tmp / "r2")
        relay2 = await _relay(r2, RelayLimits())
        client = await SwarmDHT.start(r1.visible_maddrs(), data_dir=tmp / "client")
        return r1, relay1, r2, relay2, private, registrar, running, client

    r1, relay1, r2, relay2, private, registrar, running, client = loop.run_until_complete(start())
    yield dict(r1=r1, relay1=relay1, r2=r2, private=private, registrar=registrar, client=client, seen=seen,
               identity=RelayIdentity(client.identity.private_key))
    running.cancel()

    async def stop():
        for server, task in (relay1, relay2):
            task.cancel()
            await server.close()
        for node in (client, private, r2, r1):
            await node.shutdown()

    loop.run_until_complete(stop())


def test_frames_cross_the_relay_intact_past_circuit_v2s_limit(loop, lab):
    seen, identity = lab["seen"], lab["identity"]
    addrs = seen.relays[-1]
    assert addrs and addrs[0].endswith(f"/p2p/{lab['r1'].peer_id}")

    async def run():
        stream = await relay_dial.dial(identity, addrs, lab["private"].peer_id, ECHO, 30)
        async with stream:
            moved = 0
            for i in range(40):  # 40 x 64 KiB each way: 2.5 MiB, 20x go-libp2p circuit v2's default limit
                frame = bytes([i]) * (64 * 1024)
                await stream.send(frame)
                assert await stream.recv(30) == frame
                moved += len(frame)
        return stream, moved

    stream, moved = loop.run_until_complete(run())
    assert moved == 40 * 64 * 1024
    assert stream.cipher is not None and stream.remote_peer_id == lab["private"].peer_id
    assert seen.peers[-1] == lab["client"].peer_id  # proven by the handshake, not told by the relay


def test_relayed_ping_answers(loop, lab):
    rtt_ms = loop.run_until_complete(
        relay_dial.ping(lab["identity"], lab["seen"].relays[-1], lab["private"].peer_id))
    assert 0.0 < rtt_ms < 5000.0


def test_the_relay_budget_refuses_with_busy(loop, lab):
    addrs, peer = lab["seen"].relays[-1], lab["private"].peer_id

    async def run():
        open_ = [await relay_dial.dial(lab["identity"], addrs, peer, ECHO, 30) for _ in range(2)]
        with pytest.raises(RelayRefused, match="BUSY: peer .* has 2 relayed connections open"):
            await relay_dial.dial(lab["identity"], addrs, peer, ECHO, 30)
        for s in open_:  # both work while the third is refused
            await s.send(b"still open")
            assert await s.recv(30) == b"still open"
            await s.close()

    loop.run_until_complete(run())


def test_a_peer_not_registered_there_is_refused(loop, lab):
    with pytest.raises(RelayRefused, match="not registered"):
        loop.run_until_complete(
            relay_dial.dial(lab["identity"], lab["seen"].relays[-1], lab["client"].peer_id, ECHO, 30))


def test_a_lost_relay_is_replaced_and_announced(loop, lab):
    seen, relay1 = lab["seen"], lab["relay1"]
    seen.changed.clear()

    async def kill_and_wait():
        relay1[1].cancel()
        await relay1[0].close()  # the relay's process ends: every connection to it closes
        while not (seen.relays[-1] and seen.relays[-1][0].endswith(lab["r2"].peer_id)):
            await asyncio.wait_for(seen.changed.wait(), 60)
            seen.changed.clear()
        stream = await relay_dial.dial(lab["identity"], seen.relays[-1], lab["private"].peer_id, ECHO, 30)
        async with stream:
            await stream.send(b"after the move")
            return await stream.recv(30)

    assert loop.run_until_complete(kill_and_wait()) == b"after the move"
    assert () in seen.relays  # it announced that it had none while it looked for the next
