"""UPnP port mapping in the network lab (sim/netlab.py, sim/upnplab.py): a volunteer behind a home
router running miniupnpd serves with the defaults (no `--public-address`, no fixed ports, no forward
set by hand). It asks the router to forward its libp2p, direct and relay ports, a dial-back confirms
them, and a client behind another NAT router reaches it direct (not through a relay); a clean stop
deletes the mappings. Skips where miniupnpd is not installed (.ci/run installs it).

The oracle is llama.cpp's whole-model greedy completion (tests/helpers/oracle.py).
"""

from __future__ import annotations

import json
import re

import pytest

from sim.netlab import Lab
from sim.upnplab import Redirect, enable_upnp, port_mappings, upnp_available
from tests.helpers.lab import chat_in, start_in, swarm_in
from tests.helpers.oracle import oracle
from tests.helpers.peers import PeerSet, serve_args

pytestmark = pytest.mark.lab

PROMPT = "The first thing to know about routers is"
N_NEW = 16


def test_a_peer_behind_a_upnp_router_maps_its_ports_is_dialled_direct_and_unmaps_on_stop(
    smollm2_path, tmp_path
):
    why = upnp_available()
    if why:
        pytest.skip(why)
    with Lab() as lab:
        dht_site, home, client = lab.public("dht"), lab.home("h0"), lab.home("client")
        enable_upnp(lab, home)
        peers = PeerSet(tmp_path)
        try:
            dht = start_in(peers, lab, dht_site, "dht", "dht", ready_marker="")
            peer = start_in(peers, lab, home, "h0",
                            *serve_args(smollm2_path, "0:30", "--initial-peers", dht.maddrs[0]))
            log = peer.stderr_text()
            libp2p_port = int(peer.maddrs[0].split("/tcp/")[1].split("/")[0])
            direct_port = int(re.search(r"direct streams on port (\d+)", log).group(1))
            relay_port = int(re.search(r"relaying for others on port (\d+)", log).group(1))
            wan = home.public_address
            assert (f"UPnP router {wan} forwards TCP {libp2p_port} (libp2p), {direct_port} (direct), "
                    f"{relay_port} (relay) for 3600 s") in log
            assert sorted(port_mappings(lab, home), key=lambda r: r.port) == sorted(
                (Redirect("tcp", p, home.address, p) for p in (libp2p_port, direct_port, relay_port)),
                key=lambda r: r.port)
            # the dial-back reached the peer through the mapping: public, at its router's address
            assert f"reachability public (peer {dht.peer_id[:12]}… dialled its direct port back at {wan})" \
                in log

            status = swarm_in(lab, client, "status", "--json", "--model", str(smollm2_path),
                              "--initial-peers", dht.maddrs[0])
            report = json.loads(status.stdout.strip().splitlines()[-1])
            (seen,) = report["peers"]
            assert seen["addrs"][0] == f"/ip4/{wan}/tcp/{libp2p_port}/p2p/{peer.peer_id}"
            assert seen["direct_addrs"][0] == f"/ip4/{wan}/tcp/{direct_port}"
            assert (seen["answered"], seen["transport"]) == (True, "direct")
            assert report["best_route"]["transports"] == ["direct"]

            got = chat_in(lab, client, smollm2_path, dht.maddrs, PROMPT, N_NEW)
            assert got["text"] == oracle(smollm2_path, PROMPT, N_NEW)
            route = got["telemetry"]["route"]
            assert [(h["peer_id"], h["transport"]) for h in route] == [(peer.peer_id, "direct")]

            assert peer.stop() == 0
            assert port_mappings(lab, home) == []
        finally:
            peers.stop_all()
