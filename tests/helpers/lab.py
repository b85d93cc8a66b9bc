"""Helpers for tests in the network lab (sim/netlab.py): the skip when it cannot run, peers started
inside a site's namespace, and a client run inside one.

    pytestmark = needs_lab                       # a module of lab tests: skipped with the reason
    peer = start_in(peers, lab, site, "p0", *serve_args(path, "0:10"), "--new-swarm")
    got = chat_in(lab, home, path, dht.maddrs, PROMPT, 32)   # {"text": ..., "telemetry": {...}}

A peer in a site listens on the site's own address (`--host`); one behind a NAT also needs
`--public-address`, fixed ports and `lab.forward` (see `forwarded_args`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sim.netlab import Lab, Site, lab_available
from tests.helpers.peers import PeerProcess, PeerSet

CHAT_S = 300.0
"""A client run's limit, only so a hang fails instead of blocking the suite."""

needs_lab = [
    pytest.mark.lab,
    pytest.mark.skipif(lab_available() is not None, reason=f"network lab: {lab_available()}"),
]
"""The marks of every lab test: `-m lab` selects them; where a lab cannot run, they skip and say why."""


def start_in(peers: PeerSet, lab: Lab, site: Site, name: str, *args: str, ready_marker: str = "serving layers"
             ) -> PeerProcess:
    """Start `swarm <args> --host <site address>` inside `site` (see `PeerSet.start`); `args` start with
    the command ("serve", "dht")."""
    return peers.start(name, *args, "--host", site.address, ready_marker=ready_marker,
                       launcher=lab.exec_prefix(site))


def forwarded_args(lab: Lab, site: Site, port: int, bt_port: int, direct_port: int) -> tuple[str, ...]:
    """Forward three fixed ports on the site's router and return the `serve` flags that announce them
    at the router's WAN address (the port-forwarding volunteer of issue 23, item 5)."""
    lab.forward(site, port, bt_port, direct_port)
    return ("--public-address", site.public_address, "--port", str(port), "--bt-port", str(bt_port),
            "--direct-port", str(direct_port))


def chat_in(lab: Lab, site: Site, model_path: Path, initial_peers: list[str], prompt: str, n: int) -> dict:
    """A greedy raw completion by `swarm chat --raw --json` run inside `site`.

    Returns:
        {"text": the completion, "telemetry": GenerationTelemetry.to_dict()}.
    Raises:
        AssertionError: the client exited non-zero (the message holds its stderr).
    """
    argv = [sys.executable, "-m", "swarm.cli", "chat", "--model", str(model_path), "--raw", "--json",
            "--prompt", prompt, "--max-new-tokens", str(n), "--initial-peers", *initial_peers]
    done = lab.run(site, argv, timeout_s=CHAT_S, check=False)
    assert done.returncode == 0, f"swarm chat in {site.name} failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
