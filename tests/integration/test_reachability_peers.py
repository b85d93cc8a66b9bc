"""Reachability with real peers (swarm serve, swarm dht, swarm status, swarm chat) on 127.0.0.1.

A peer that others cannot reach is played by a peer started with `--reachability private` and then
frozen (SIGSTOP of its whole process tree): it stays announced, answers nothing, and announces the
cause. Status, the API's monitor and chat must say "announced but unreachable" with that cause and
the fix, never "not covered"."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from swarm.api.health import HealthMonitor
from swarm.client.api import Client
from swarm.client.connection import SwarmConnection
from swarm.client.status import probe_peers, swarm_status
from swarm.errors import NoRoute
from swarm.manifest import build_manifest
from tests.helpers.peers import serve_args, signal_tree, wait_for


def announced(maddrs, model_path):
    """The model's announcements as a fresh client reads them."""
    manifest = build_manifest(model_path)
    conn = SwarmConnection(list(maddrs))
    try:
        return conn.announcements(manifest.model_id, manifest.n_layers)
    finally:
        conn.close()


def test_peers_that_joined_through_another_learn_they_are_public(smol_swarm, smollm2_path):
    first = smol_swarm.started[0]
    by_id = wait_for(
        lambda: {a.peer_id: a for a in announced(first.maddrs, smollm2_path)},
        "the joining peers announce public reachability",
        until=lambda anns: all(anns.get(p.peer_id) and anns[p.peer_id].reachability == "public"
                               for p in smol_swarm.started[1:]),
    )
    for p in smol_swarm.started[1:]:
        stderr = p.stderr_text()
        assert "reachability public (peer " in stderr and "dialled its direct port back at 127.0.0.1" in stderr
        assert by_id[p.peer_id].direct_addrs[0].startswith("/ip4/127.0.0.1/tcp/")


def test_a_private_peer_that_does_not_answer_is_reported_unreachable_not_missing(peers, smollm2_path, loop):
    dht = peers.start("dht", "dht", ready_marker="")
    peer = peers.start("p", *serve_args(smollm2_path, "0:30", "--initial-peers", dht.maddrs[0],
                                        "--reachability", "private", "--relay", "off"))
    assert "reachability private (set by --reachability private)" in peer.stderr_text()
    live = swarm_status(str(smollm2_path), dht.maddrs)
    assert [(p.peer_id, p.reachability) for p in live.peers] == [(peer.peer_id, "private")]
    assert live.transport == {peer.peer_id: "direct"}
    assert live.verdict()[1].startswith(f"route exists: best 0:30 ({peer.peer_id[:12]}…, direct)")

    signal_tree(peer, signal.SIGSTOP)
    try:
        report = swarm_status(str(smollm2_path), dht.maddrs)
        lines = report.verdict()
        assert lines[0].startswith("layers 0:30 announced but unreachable: 1 peer(s) serving them did not "
                                   "answer (it announces private reachability: behind a NAT")
        assert "forward their ports" in lines[0] and "--public-address" in lines[0]
        assert not any("not covered" in line for line in lines)
        assert report.to_dict()["uncovered_layers"] == []

        conn = SwarmConnection(list(dht.maddrs))
        try:
            manifest = build_manifest(smollm2_path)

            async def read():
                return conn.announcements(manifest.model_id, manifest.n_layers)

            async def probe(anns):
                return conn.loop.run(probe_peers(conn, anns), timeout_s=30)

            monitor = HealthMonitor(read, manifest.model_id, manifest.n_layers, 60.0, probe)
            api = loop.run_until_complete(monitor.refresh()).to_dict()
        finally:
            conn.close()
        assert api["unreachable_layers"] == list(range(30)) and api["uncovered_layers"] == []
        assert api["unreachable_why"].startswith("it announces private reachability")
        assert [(p["answered"], p["reachability"]) for p in api["peers"]] == [(False, "private")]

        with Client(str(smollm2_path), initial_peers=dht.maddrs) as client:
            with pytest.raises(NoRoute) as e:
                client.generate("Hello", max_new_tokens=2)
        assert "announced, but by no peer that answers" in str(e.value)
        assert "private reachability" in str(e.value)

        chat = subprocess.run(
            [sys.executable, "-m", "swarm.cli", "chat", "--model", str(smollm2_path), "--initial-peers",
             dht.maddrs[0], "--prompt", "Hello", "--max-new-tokens", "2"],
            capture_output=True, text=True, timeout=300,
        )
        assert chat.returncode != 0
        assert "layers 0:30 are announced, but by no peer that answers" in chat.stderr
        assert "private reachability" in chat.stderr and "no usable peer serves" not in chat.stderr
    finally:
        signal_tree(peer, signal.SIGCONT)
