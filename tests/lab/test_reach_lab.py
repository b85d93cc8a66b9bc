"""Reachability in the network lab (sim/netlab.py): peers behind home NAT routers learn by dial-back
whether others can reach them, and status and chat tell an unreachable peer from a missing layer.

- Two serving peers each behind its own NAT with no port forward, a public DHT peer, a client
  behind a third NAT, relaying off (`--relay off`): `swarm status` and `swarm chat` in the client's site say layers
  0:30 are announced but unreachable and why (the peers announce private reachability, learned by
  a dial-back that their routers dropped), never that layers are missing.
- A peer behind a NAT whose router forwards its fixed ports, started without `--public-address`,
  learns its router's WAN address from a dial-back and announces it first: the client behind
  another NAT reaches it direct.
"""

from __future__ import annotations

import json
import sys

import pytest

from sim.netlab import Lab
from swarm.localswarm import wait_ready
from tests.helpers.lab import launch_in, start_in
from tests.helpers.peers import PeerSet, serve_args

pytestmark = pytest.mark.lab

PORT, BT_PORT, DIRECT_PORT = 41001, 41002, 41003


@pytest.fixture(scope="module")
def lab():
    """A public DHT site, three homes behind NAT routers (h0 and h1 forward nothing, h2 forwards its
    fixed ports) and a client home."""
    with Lab() as lab:
        lab.public("dht")
        lab.home("h0")
        lab.home("h1", nat="random")
        lab.forward(lab.home("h2"), PORT, BT_PORT, DIRECT_PORT)
        lab.home("client")
        yield lab


def swarm_in(lab: Lab, site: str, *args: str):
    """`swarm <args>` run to completion in `site`."""
    return lab.run(lab.sites[site], [sys.executable, "-m", "swarm.cli", *args], timeout_s=300, check=False)


def test_peers_behind_nat_without_forwards_are_reported_unreachable_not_missing(lab, smollm2_path, tmp_path):
    peers = PeerSet(tmp_path)
    try:
        dht = start_in(peers, lab, lab.sites["dht"], "dht", "dht", ready_marker="")
        for name, span in (("h0", "0:15"), ("h1", "15:30")):  # launched together, then waited for
            launch_in(peers, lab, lab.sites[name], name,
                      *serve_args(smollm2_path, span, "--initial-peers", dht.maddrs[0], "--relay", "off"))
        for name, p in zip(("h0", "h1"), peers.started[1:]):
            wait_ready(p)
            # the DHT peer saw it at its router's WAN address and could not dial that back
            assert f"reachability private (1 peer(s) saw it at {lab.sites[name].public_address} but could " \
                   "not dial it back" in p.stderr_text()

        status = swarm_in(lab, "client", "status", "--model", str(smollm2_path), "--initial-peers",
                          dht.maddrs[0], "--json")
        assert status.returncode == 3, status.stderr[-2000:]
        report = json.loads(status.stdout)
        assert report["unreachable_layers"] == list(range(30)) and report["uncovered_layers"] == []
        assert report["unreachable_why"].startswith("2 of them announce private reachability: behind a NAT")
        assert [(p["answered"], p["reachability"]) for p in report["peers"]] == [(False, "private")] * 2

        # (the table says it from the same report: tests/unit/test_status.py, test_reachability_peers.py)

        chat = swarm_in(lab, "client", "chat", "--model", str(smollm2_path), "--initial-peers", dht.maddrs[0],
                        "--raw", "--prompt", "Hello", "--max-new-tokens", "2")
        assert chat.returncode != 0
        assert "layers 0:30 are announced, but by no peer that answers: 2 peer(s)" in chat.stderr
        assert "2 of them announce private reachability" in chat.stderr
        assert "no usable peer serves" not in chat.stderr
    finally:
        peers.stop_all()


def test_a_peer_behind_a_forwarding_nat_learns_and_announces_its_public_address(lab, smollm2_path, tmp_path):
    peers = PeerSet(tmp_path)
    h2 = lab.sites["h2"]
    try:
        dht = start_in(peers, lab, lab.sites["dht"], "dht", "dht", ready_marker="")
        p = start_in(peers, lab, h2, "h2", *serve_args(
            smollm2_path, "0:30", "--initial-peers", dht.maddrs[0], "--port", str(PORT),
            "--bt-port", str(BT_PORT), "--direct-port", str(DIRECT_PORT)))  # no --public-address
        assert f"dialled its direct port back at {h2.public_address}" in p.stderr_text()

        status = swarm_in(lab, "client", "status", "--model", str(smollm2_path), "--initial-peers",
                          dht.maddrs[0], "--json")
        assert status.returncode == 0, status.stderr[-2000:]
        report = json.loads(status.stdout)
        (peer,) = report["peers"]
        assert peer["reachability"] == "public"
        assert peer["direct_addrs"][0] == f"/ip4/{h2.public_address}/tcp/{DIRECT_PORT}"
        assert peer["addrs"][0] == f"/ip4/{h2.public_address}/tcp/{PORT}/p2p/{p.peer_id}"
        # the client, behind its own NAT, reached it through the forward, direct
        assert (peer["answered"], peer["transport"]) == (True, "direct")
        assert report["best_route"]["transports"] == ["direct"]
    finally:
        peers.stop_all()
