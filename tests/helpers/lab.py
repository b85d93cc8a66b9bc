"""Helpers for tests and benchmarks in the network lab (sim/netlab.py): peers started inside a
site's namespace, and a client run inside one. (tests/lab/conftest.py skips every lab test, saying
why, where a lab cannot run; modules there carry `pytestmark = pytest.mark.lab`.)

    peer = start_in(peers, lab, site, "p0", *serve_args(path, "0:10"), "--new-swarm")
    got = chat_in(lab, home, path, dht.maddrs, PROMPT, 32)   # {"text": ..., "telemetry": {...}}
    done = swarm_in(lab, home, "status", "--model", str(path), "--initial-peers", *dht.maddrs)

A peer in a site listens on the site's own address (`--host`); one behind a NAT also needs
`--public-address`, fixed ports and `lab.forward` (see `forwarded_args`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim.netlab import Lab, Site
from tests.helpers.peers import PeerProcess, PeerSet

CHAT_S = 300.0
"""A client run's limit, only so a hang fails instead of blocking the suite."""


def start_in(
    peers: PeerSet, lab: Lab, site: Site, name: str, *args: str, ready_marker: str = "serving layers"
) -> PeerProcess:
    """Start `swarm <args> --host <site address>` inside `site` (see `PeerSet.start`); `args` start with
    the command ("serve", "dht")."""
    return peers.start(
        name, *args, "--host", site.address, ready_marker=ready_marker, launcher=lab.exec_prefix(site)
    )


def forwarded_args(lab: Lab, site: Site, port: int, bt_port: int, direct_port: int) -> tuple[str, ...]:
    """Forward three fixed ports on the site's router and return the `serve` flags that announce them
    at the router's WAN address (the port-forwarding volunteer of issue 23, item 5)."""
    lab.forward(site, port, bt_port, direct_port)
    return (
        "--public-address",
        site.public_address,
        "--port",
        str(port),
        "--bt-port",
        str(bt_port),
        "--direct-port",
        str(direct_port),
    )


def swarm_in(lab: Lab, site: Site, *args: str, timeout_s: float = CHAT_S) -> subprocess.CompletedProcess:
    """Run `swarm <args>` (chat, status, ...) inside `site` to completion; output captured as text,
    whatever its exit status (a test asserts on it)."""
    return lab.run(site, [sys.executable, "-m", "swarm.cli", *args], timeout_s=timeout_s, check=False)


def chat_in(lab: Lab, site: Site, model_path: Path, initial_peers: list[str], prompt: str, n: int) -> dict:
    """A greedy raw completion by `swarm chat --raw --json` run inside `site`.

    Returns:
        {"text": the completion, "telemetry": GenerationTelemetry.to_dict()}.
    Raises:
        AssertionError: the client exited non-zero (the message holds its stderr).
    """
    done = swarm_in(
        lab,
        site,
        "chat",
        "--model",
        str(model_path),
        "--raw",
        "--json",
        "--prompt",
        prompt,
        "--max-new-tokens",
        str(n),
        "--initial-peers",
        *initial_peers,
    )
    assert done.returncode == 0, f"swarm chat in {site.name} failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
