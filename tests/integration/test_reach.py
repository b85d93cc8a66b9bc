"""Reachability between real nodes on 127.0.0.1: dial-back probes (swarm.reach) and streams that do
not wait on a direct endpoint that never answers (swarm.dialing).

A "blackholed" endpoint is a real listening socket whose accept queue is full: the kernel drops new
SYNs, so a dial waits exactly as for a port that is not forwarded or is firewalled."""

from __future__ import annotations

import socket

import pytest

from swarm.dht.node import SwarmDHT
from swarm.dialing import open_stream
from swarm.direct import DIAL_TIMEOUT_S, DirectServer, direct_maddrs
from swarm.netaddr import listen_port
from swarm.p2p import FramedStream
from swarm.reach import DialBackResponder, ReachabilityMonitor, ask_dialback
from swarm.reach_rules import PRIVATE, PUBLIC, DialBackBudget, announced_direct_addrs, decide

ECHO = "/test/reach-echo/1"


async def echo(stream: FramedStream) -> None:
    while True:
        await stream.send(await stream.recv())


@pytest.fixture(scope="module")
def nodes(loop, tmp_path_factory):
    """An answering node (a dial-back responder) and an asking node with a direct listener for ECHO."""
    tmp = tmp_path_factory.mktemp("reach")

    async def start():
        helper = await SwarmDHT.start(data_dir=tmp / "helper")
        await DialBackResponder(DialBackBudget(per_window=100, per_asker=4)).serve(helper.transport)
        asker = await SwarmDHT.start(helper.visible_maddrs(), data_dir=tmp / "asker")
        direct = DirectServer()
        port = await direct.listen("127.0.0.1", 0)
        await direct.open(asker.transport, {ECHO: echo})
        await asker.transport.serve(ECHO, echo)
        return helper, asker, direct, port

    helper, asker, direct, port = loop.run_until_complete(start())
    yield helper, asker, direct, port
    loop.run_until_complete(direct.close())
    loop.run_until_complete(asker.shutdown())
    loop.run_until_complete(helper.shutdown())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def blackhole():
    """A 127.0.0.1 port whose SYNs are dropped (a listener with a full accept queue)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    yield port
    for c in fillers:
        c.close()
    listener.close()


def test_a_dial_back_reaches_the_listener_and_confirms_the_observed_address(loop, nodes):
    helper, asker, direct, port = nodes
    answer = loop.run_until_complete(ask_dialback(
        asker.transport, helper.peer_id, helper.visible_maddrs(), direct.expect_nonce, direct.forget_nonce,
        port, listen_port(asker.visible_maddrs())))
    assert (answer.error, answer.observed_host, answer.direct_ok, answer.libp2p_ok) == ("", "127.0.0.1", True, True)
    reach = decide([answer], has_direct=True)
    assert reach.status == PUBLIC
    assert announced_direct_addrs((), reach, port) == (f"/ip4/127.0.0.1/tcp/{port}",)


def test_a_direct_port_nobody_listens_on_is_not_reached(loop, nodes):
    helper, asker, direct, _ = nodes
    answer = loop.run_until_complete(ask_dialback(
        asker.transport, helper.peer_id, helper.visible_maddrs(), direct.expect_nonce, direct.forget_nonce,
        closed_port(), None))
    assert (answer.error, answer.observed_host, answer.direct_ok, answer.libp2p_ok) == ("", "127.0.0.1", False, None)
    assert decide([answer], has_direct=True).status == PRIVATE


def test_the_answering_peer_keeps_to_its_budget_per_asker(loop, nodes):
    helper, asker, direct, port = nodes
    answers = [loop.run_until_complete(ask_dialback(
        asker.transport, helper.peer_id, helper.visible_maddrs(), direct.expect_nonce, direct.forget_nonce,
        port, None)) for _ in range(5)]  # the module's other tests take up to 2 of the 4
    assert answers[-1].error == "refused: at most 4 dial-backs per peer per 60 s"
    assert not answers[-1].direct_ok


def test_a_monitor_probes_in_auto_mode_and_does_not_in_a_forced_one(loop, nodes):
    helper, _, _, _ = nodes
    asked = []

    async def helpers():
        asked.append(True)
        return [(helper.peer_id, tuple(helper.visible_maddrs()))]

    forced = ReachabilityMonitor("private", helper.transport, helpers, None, lambda n: None, None, 1)
    assert loop.run_until_complete(forced.probe()).private and forced.current.forced and asked == []
    # the only peer to ask is the monitor's own node: nobody to ask, so unknown
    auto = ReachabilityMonitor("auto", helper.transport, helpers, None, lambda n: None, None, 1)
    assert loop.run_until_complete(auto.probe()).status == "unknown" and asked == [True]
    assert auto.current.reason == "no dial-back answer (no peer to ask)"


def test_a_blackholed_direct_endpoint_costs_no_dial_timeout(loop, nodes, blackhole):
    helper, asker, _, _ = nodes
    opened = loop.run_until_complete(open_stream(
        helper.transport, asker.peer_id, asker.visible_maddrs(), direct_maddrs(["127.0.0.1"], blackhole),
        ECHO, 30.0))
    try:
        assert opened.kind == "libp2p"
        # libp2p opened first and direct was given up before its own DIAL_TIMEOUT_S could end it
        assert opened.attempts[0] == "libp2p opened"
        assert opened.attempts[1].startswith("direct abandoned: direct dial abandoned: libp2p, started 250 ms after")
        assert f"timed out after {DIAL_TIMEOUT_S:.1f} s" not in opened.direct_error
        assert f"direct was still dialling 127.0.0.1:{blackhole} (no answer" in opened.direct_error
        loop.run_until_complete(opened.stream.send(b"hello"))
        assert loop.run_until_complete(opened.stream.recv(10)) == b"hello"
    finally:
        loop.run_until_complete(opened.stream.close())


def test_a_refused_direct_endpoint_says_so_and_falls_back(loop, nodes):
    helper, asker, _, _ = nodes
    port = closed_port()
    opened = loop.run_until_complete(open_stream(
        helper.transport, asker.peer_id, asker.visible_maddrs(), direct_maddrs(["127.0.0.1"], port), ECHO, 30.0))
    try:
        assert opened.kind == "libp2p"
        assert opened.direct_error.endswith(f"answered: Connection refused dialling 127.0.0.1:{port}")
    finally:
        loop.run_until_complete(opened.stream.close())


def test_a_reachable_direct_endpoint_wins_over_a_dead_one(loop, nodes, blackhole):
    helper, asker, _, port = nodes
    endpoints = direct_maddrs(["127.0.0.1"], blackhole) + direct_maddrs(["127.0.0.1"], port)
    opened = loop.run_until_complete(open_stream(
        helper.transport, asker.peer_id, asker.visible_maddrs(), endpoints, ECHO, 30.0))
    try:
        assert (opened.kind, opened.direct_error) == ("direct", "")
        assert opened.stream.cipher is not None
        loop.run_until_complete(opened.stream.send(b"x" * 100))
        assert loop.run_until_complete(opened.stream.recv(10)) == b"x" * 100
    finally:
        loop.run_until_complete(opened.stream.close())
