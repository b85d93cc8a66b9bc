"""Issue 23's acceptance for volunteers behind home routers, in the network lab (sim/netlab.py):
two serving peers each behind its own NAT router with no port forward, a public DHT peer (which
relays, the default), and a client behind a third NAT router. The peers are `--reachability private`:
each registers with the relay over an outbound connection and announces only the relay's address;
the client and the pushing peer reach them through it. Once with routers that keep source ports,
once with routers that randomise them.

The oracle is llama.cpp's whole-model greedy completion (tests/helpers/oracle.py).
"""

from __future__ import annotations

import json

import pytest

from sim.netlab import Lab
from swarm.localswarm import wait_ready
from tests.helpers.lab import chat_in, launch_in, start_in, swarm_in
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args

pytestmark = pytest.mark.lab

PROMPT = "The history of lighthouses begins"
N_NEW = 512


@pytest.fixture(scope="module", params=["keep", "random"], ids=["nat-keeps-ports", "nat-randomises-ports"])
def nat_swarm(request, smollm2_path, tmp_path_factory):
    """The public DHT+relay peer, serving peers 0:15 and 15:30 behind their own NAT routers (no
    forwards), a client site behind a third."""
    with Lab() as lab:
        dht_site = lab.public("dht")
        homes = [lab.home("h0", nat=request.param), lab.home("h1", nat=request.param)]
        lab.home("client", nat=request.param)
        peers = PeerSet(tmp_path_factory.mktemp(f"nat_swarm_{request.param}"))
        try:
            dht = start_in(peers, lab, dht_site, "dht", "dht", ready_marker="")
            for home, span in zip(homes, ("0:15", "15:30")):  # launched together, then waited for
                launch_in(peers, lab, home, home.name, *serve_args(
                    smollm2_path, span, "--initial-peers", dht.maddrs[0], "--reachability", "private"))
            for peer in peers.started[1:]:
                wait_ready(peer)
            yield lab, peers
        finally:
            peers.stop_all()


def test_peers_behind_nat_without_forwards_serve_a_long_generation_through_the_relay(nat_swarm, smollm2_path):
    lab, peers = nat_swarm
    dht, h0, h1 = peers.started
    for peer in (h0, h1):  # registered with the public peer's relay, at its public address
        assert f"reached through relay /ip4/{lab.sites['dht'].address}/tcp/" in peer.stderr_text()
    status = swarm_in(lab, lab.sites["client"], "status", "--json", "--model", str(smollm2_path),
                      "--initial-peers", *dht.maddrs)
    report = json.loads(status.stdout.strip().splitlines()[-1])
    assert report["route_exists"], status.stderr[-3000:]
    assert report["best_route"]["transports"] == ["relayed", "relayed"]
    assert [h[0] for h in report["best_route"]["hops"]] == [h0.peer_id, h1.peer_id]
    got = chat_in(lab, lab.sites["client"], smollm2_path, dht.maddrs, PROMPT, N_NEW)
    assert got["text"] == oracle(smollm2_path, PROMPT, N_NEW)
    t = got["telemetry"]
    assert [(h["peer_id"], h["transport"]) for h in t["route"]] == [(h0.peer_id, "relayed"), (h1.peer_id, "relayed")]
    # h0 pushed its outputs into h1 through the relay: a dial from behind one NAT to a peer behind another
    assert t["route"][1]["pushed_steps"] >= t["generated_tokens"] - 2
    assert not t["failovers"]
