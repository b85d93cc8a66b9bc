"""The client's link protocol (swarm/client/link.py): Error frames as exceptions, and a relayed
step as send + recv over a simulated link (sim/transport.py)."""

from __future__ import annotations

import asyncio

import pytest

from sim.transport import SimSwarm, SpanPeer, VirtualClock, embed
from swarm.client.link import error_of
from swarm.errors import Busy, PeerTimeout, PeerUnreachable, ProtocolError, ShuttingDown, SwarmError
from swarm.sampling import SamplingParams
from swarm.wire import Error, ErrorCode, Forward, Hidden, Open, OpenOk


@pytest.mark.parametrize(
    "code, kind",
    [
        (ErrorCode.BUSY, Busy),
        (ErrorCode.SHUTTING_DOWN, ShuttingDown),
        (ErrorCode.NOT_FOUND, PeerUnreachable),
        (ErrorCode.PROTOCOL, ProtocolError),
        (ErrorCode.BAD_REQUEST, SwarmError),
        (ErrorCode.INTERNAL, SwarmError),
    ],
)
def test_an_error_frame_becomes_its_exception_naming_the_peer(code, kind):
    err = error_of("0123456789abcdefXYZ", Error(code, "why"))
    assert type(err) is kind and str(err) == "peer 0123456789ab…: why"


def test_a_sim_link_answers_each_sent_frame_in_order_and_a_frozen_peer_times_out():
    clock = VirtualClock()
    peer = SpanPeer("p", 0, 2, 4, rtt_ms=10.0)  # layers [0, 2) of 4: answers Hidden
    swarm = SimSwarm([peer], clock)

    async def go():
        link = await swarm.connect("p", 1.0)
        assert await link.send(Open(b"s" * 16, "c", "ab" * 8, 0, 2, 8, SamplingParams()), 1.0) == 100
        x = embed(7)
        await link.send(Forward(step=0, pos0=0, hidden=x), 1.0)
        assert isinstance((await link.recv(1.0))[0], OpenOk)
        assert isinstance((await link.recv(1.0))[0], Hidden)
        assert clock.now() == pytest.approx(0.02)
        peer.state = "frozen"
        await link.send(Forward(step=1, pos0=1, hidden=x), 1.0)
        with pytest.raises(PeerTimeout, match="within 2.5 s"):
            await link.recv(2.5)
        assert clock.now() == pytest.approx(2.52)
        await link.close()
        with pytest.raises(PeerUnreachable):
            await link.send(Forward(step=2, pos0=1, hidden=x), 1.0)

    asyncio.run(go())
