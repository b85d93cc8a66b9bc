"""A swarm whose serving peers cannot be dialled: each is `--reachability private` and announces only
its relay's address (no libp2p or direct one), as a volunteer behind a home router would without a
port forward. Clients and pushing peers reach them through relays (`swarm dht` relays by default),
whole generations pass and equal llama.cpp's whole model, and a relay killed mid-generation costs a
failover, not a token of the text.

On 127.0.0.1 every port is reachable: "private" here is what the peer announces, so the route can
only go through the relays. tests/lab/ runs the same behind real NATs where the lab can run.
"""

from __future__ import annotations

import signal

import pytest

from swarm import Client
from swarm.client.status import swarm_status

from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args, signal_tree

PROMPT = "The history of lighthouses begins"
N_NEW = 512


@pytest.fixture(scope="module")
def relayed(smollm2_path, tmp_path_factory):
    """A DHT peer that relays (the default), private peers 0:15 and 15:30 registered with it."""
    ps = PeerSet(tmp_path_factory.mktemp("relayed"))
    dht = ps.start("dht", "dht", ready_marker="")
    for name, span in (("a", "0:15"), ("b", "15:30")):
        ps.start(name, *serve_args(smollm2_path, span, "--initial-peers", dht.maddrs[0],
                                   "--reachability", "private"))
    yield ps
    ps.stop_all()


def test_a_long_generation_through_two_relayed_peers_equals_the_whole_model(relayed, smollm2_path):
    dht, a, b = relayed.started
    assert "reached through relay /ip4/127.0.0.1/tcp/" in a.stderr_text()
    with Client(str(smollm2_path), initial_peers=[dht.maddrs[0]]) as client:
        got = client.generate(PROMPT, max_new_tokens=N_NEW)
    assert got.text == oracle(smollm2_path, PROMPT, N_NEW)
    route = got.telemetry.route
    assert [(h.peer_id, h.transport) for h in route] == [(a.peer_id, "relayed"), (b.peer_id, "relayed")]
    assert got.telemetry.generated_tokens > 256
    # a pushed its outputs to b through the relay too (Chain.next_relay): the client only read answers
    assert route[1].pushed_steps >= got.telemetry.generated_tokens - 2
    assert not got.telemetry.failovers


def test_status_pings_relayed_peers_through_their_relay(relayed, smollm2_path):
    dht, a, b = relayed.started
    report = swarm_status(str(smollm2_path), [dht.maddrs[0]])
    by_id = {p.peer_id: p for p in report.peers}
    for peer in (a, b):  # announced with no address of its own, only its relay's
        ann = by_id[peer.peer_id]
        assert (ann.addrs, ann.direct_addrs) == ((), ())
        assert [r.rsplit("/p2p/", 1)[1] for r in ann.relay_addrs] == [dht.peer_id]
        assert report.rtt_ms[peer.peer_id] is not None  # answered through the relay
    assert report.chains.complete and not report.silent


def test_a_relay_killed_mid_generation_costs_a_failover_not_the_text(peers: PeerSet, smollm2_path):
    # r1 takes one peer: a registers there (the only relay yet); b finds r1 full and takes r2
    dht = peers.start("dht", "dht", "--no-relay-service", ready_marker="")
    join = ("--initial-peers", dht.maddrs[0])
    r1 = peers.start("r1", "dht", *join, "--relay-max-peers", "1", ready_marker="")
    a = peers.start("a", *serve_args(smollm2_path, "0:30", *join, "--reachability", "private"))
    r2 = peers.start("r2", "dht", *join, ready_marker="")
    b = peers.start("b", *serve_args(smollm2_path, "0:30", *join, "--reachability", "private"))
    assert f"/p2p/{r1.peer_id}" in a.stderr_text() and f"/p2p/{r2.peer_id}" in b.stderr_text()
    relay_of = {a.peer_id: r1, b.peer_id: r2}
    n_new = 160
    with Client(str(smollm2_path), initial_peers=[dht.maddrs[0]]) as client:
        stream = client.stream(PROMPT, max_new_tokens=n_new)
        used = None
        for i, _ in enumerate(stream, 1):
            if i == 40:
                used = stream.telemetry.route[0].peer_id
                signal_tree(relay_of[used], signal.SIGKILL)  # the relay's machine dies
        got = stream.result
    assert got.text == oracle(smollm2_path, PROMPT, n_new)
    [f] = got.telemetry.failovers
    other = b.peer_id if used == a.peer_id else a.peer_id
    assert f.peer_id == used and f.replacements == [other]
    assert [(h.peer_id, h.transport) for h in got.telemetry.route] == [(other, "relayed")]
