"""Real swarms in the network lab (sim/netlab.py): `swarm dht` / `swarm serve` processes in public
sites 20 ms apart, peers behind NAT routers with port forwards, and clients behind NAT routers.

The oracle for every output is llama.cpp's whole-model greedy completion (tests/helpers/oracle.py).
Each module fixture is one read-only swarm; the tests only open sessions on it.
"""

from __future__ import annotations

import pytest

from sim.netlab import Lab
from swarm.localswarm import wait_ready
from tests.helpers.lab import chat_in, forwarded_args, launch_in, start_in
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args

pytestmark = pytest.mark.lab

PROMPT = "The three most important inventions of the twentieth century are"
N_NEW = 24
RTT_MS = 20.0
SPANS = ("0:10", "10:20", "20:30")


@pytest.fixture(scope="module")
def far_swarm(smollm2_path, tmp_path_factory):
    """A public DHT peer and three public serving peers (0:10, 10:20, 20:30 of SmolLM2), every two
    sites RTT_MS apart, and a client site behind a NAT router (no port forward)."""
    with Lab() as lab:
        lab.public("dht")
        for i in range(len(SPANS)):
            lab.public(f"p{i}")
        lab.home("client")
        lab.set_rtt(RTT_MS)
        peers = PeerSet(tmp_path_factory.mktemp("far_swarm"))
        try:
            dht = start_in(peers, lab, lab.sites["dht"], "dht", "dht", ready_marker="")
            for i, span in enumerate(SPANS):  # launched together, then waited for
                launch_in(peers, lab, lab.sites[f"p{i}"], f"p{i}",
                          *serve_args(smollm2_path, span, "--initial-peers", dht.maddrs[0]))
            for peer in peers.started[1:]:
                wait_ready(peer)
            yield lab, peers
        finally:
            peers.stop_all()


@pytest.fixture(scope="module")
def forwarding_swarm(smollm2_path, tmp_path_factory):
    """Issue 23, item 5: a public DHT peer and two serving peers (0:15, 15:30), each behind its own
    NAT router (one keeping source ports, one randomising them) with `--public-address`, fixed ports
    and the router forwarding them; a client behind a third NAT router. No delay."""
    with Lab() as lab:
        dht_site = lab.public("dht")
        homes = [lab.home("h0", nat="keep"), lab.home("h1", nat="random")]
        lab.home("client")
        peers = PeerSet(tmp_path_factory.mktemp("forwarding_swarm"))
        try:
            dht = start_in(peers, lab, dht_site, "dht", "dht", ready_marker="")
            for home, span in zip(homes, ("0:15", "15:30")):
                fwd = forwarded_args(lab, home, port=41001, bt_port=41002, direct_port=41003)
                launch_in(peers, lab, home, home.name,
                          *serve_args(smollm2_path, span, "--initial-peers", dht.maddrs[0], *fwd))
            for peer in peers.started[1:]:
                wait_ready(peer)
            yield lab, peers
        finally:
            peers.stop_all()


def test_a_client_behind_nat_gets_llama_cpp_text_from_peers_20ms_apart(far_swarm, smollm2_path):
    lab, peers = far_swarm
    got = chat_in(lab, lab.sites["client"], smollm2_path, peers.started[0].maddrs, PROMPT, N_NEW)
    assert got["text"] == oracle(smollm2_path, PROMPT, N_NEW)
    t = got["telemetry"]
    route = t["route"]
    assert [f"{h['start']}:{h['end']}" for h in route] == list(SPANS)
    assert [h["peer_id"] for h in route] == [p.peer_id for p in peers.started[1:]]
    assert [h["transport"] for h in route] == ["direct"] * 3
    assert [h["pushed_steps"] for h in route] == [0, N_NEW, N_NEW]
    # Server push over three hops: each decode step crosses client -> p0 -> p1 -> p2 -> client, four
    # one-way trips of RTT/2, so no token can follow the one before it sooner than two round trips.
    assert t["generated_tokens"] == N_NEW
    assert min(t["token_latencies_ms"][1:]) >= 2 * RTT_MS
    # and the first token waited at least for the prefill's trip round the same ring
    assert t["ttft_ms"] >= 2 * RTT_MS


def test_peers_behind_nat_with_port_forwards_serve_and_push_across_both_nats(forwarding_swarm, smollm2_path):
    lab, peers = forwarding_swarm
    got = chat_in(lab, lab.sites["client"], smollm2_path, peers.started[0].maddrs, PROMPT, N_NEW)
    assert got["text"] == oracle(smollm2_path, PROMPT, N_NEW)
    route = got["telemetry"]["route"]
    assert [(h["start"], h["end"]) for h in route] == [(0, 15), (15, 30)]
    assert [h["transport"] for h in route] == ["direct", "direct"]
    assert [h["direct_error"] for h in route] == ["", ""]
    # h0 pushed every step into h1 through h1's router: a dial from behind one NAT to a forward of another
    assert [h["pushed_steps"] for h in route] == [0, N_NEW]
    # what each peer announced is its router's WAN address: the only one the client could dial
    for peer, home in zip(peers.started[1:], (lab.sites["h0"], lab.sites["h1"])):
        assert peer.maddrs and all(f"/ip4/{home.public_address}/" in m for m in peer.maddrs)
