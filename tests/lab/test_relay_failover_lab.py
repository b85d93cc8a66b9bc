"""Issue 23's acceptance "the relay in use is killed mid-generation: the generation completes with
identical text through another relay or hop", in the network lab (sim/netlab.py): a public DHT peer
that offers no relay, two public relays (`swarm dht` sites), two serving peers of the whole model each
behind its own NAT router without forwards (`--reachability private`), and a client behind a third.
`--relay-max-peers 1` on the first relay sends the second serving peer to the second relay, so the
two peers sit behind different relays; the client kills the relay its route uses after a set number
of streamed tokens (tests/integration/test_relay_swarm.py does the same on loopback).

The oracle is llama.cpp's whole-model greedy completion (tests/helpers/oracle.py).
"""

from __future__ import annotations

import signal

import pytest

from sim.netlab import Lab
from tests.helpers.lab import start_in, stream_in
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args, signal_tree

pytestmark = pytest.mark.lab

PROMPT = "The history of lighthouses begins"
N_NEW = 96
KILL_AT = 32
"""Tokens the client has streamed when the relay of its route's hop is killed."""


@pytest.fixture
def two_relays(smollm2_path, tmp_path):
    """(lab, peers, {serving peer id: its relay}); the client site is "client"."""
    with Lab() as lab:
        peers = PeerSet(tmp_path)
        try:
            dht = start_in(peers, lab, lab.public("dht"), "dht", "dht", "--no-relay-service", ready_marker="")
            join = ("--initial-peers", dht.maddrs[0])
            # a registers with r1, the only relay yet; r1 is then full, so b takes r2
            r1_site, r2_site = lab.public("r1"), lab.public("r2")
            r1 = start_in(peers, lab, r1_site, "r1", "dht", *join, "--relay-max-peers", "1", ready_marker="")
            a = start_in(peers, lab, lab.home("a"), "a",
                         *serve_args(smollm2_path, "0:30", *join, "--reachability", "private"))
            r2 = start_in(peers, lab, r2_site, "r2", "dht", *join, ready_marker="")
            b = start_in(peers, lab, lab.home("b"), "b",
                         *serve_args(smollm2_path, "0:30", *join, "--reachability", "private"))
            lab.home("client")
            for peer, relay, site in ((a, r1, r1_site), (b, r2, r2_site)):
                assert f"reached through relay /ip4/{site.address}/tcp/" in peer.stderr_text()
                assert f"/p2p/{relay.peer_id}" in peer.stderr_text()
            yield lab, peers, {a.peer_id: r1, b.peer_id: r2}
        finally:
            peers.stop_all()


def test_the_relay_in_use_killed_mid_generation_costs_a_failover_not_the_text(two_relays, smollm2_path):
    lab, peers, relay_of = two_relays
    dht = peers.started[0]
    used = None
    with stream_in(lab, lab.sites["client"], smollm2_path, dht.maddrs, PROMPT, N_NEW) as stream:
        for i, first_hop in stream.tokens():
            if i == KILL_AT:
                used = first_hop
                signal_tree(relay_of[used], signal.SIGKILL)  # the relay's machine dies
        got = stream.result()
    assert used is not None
    assert got["text"] == oracle(smollm2_path, PROMPT, N_NEW)
    t = got["telemetry"]
    [other] = [p for p in relay_of if p != used]
    [f] = t["failovers"]
    assert (f["peer_id"], f["replacements"]) == (used, [other])
    assert [(h["peer_id"], h["transport"]) for h in t["route"]] == [(other, "relayed")]
