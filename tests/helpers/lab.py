"""Helpers for tests and benchmarks in the network lab (sim/netlab.py): peers started inside a
site's namespace, and a client run inside one. (tests/lab/conftest.py skips every lab test, saying
why, where a lab cannot run; modules there carry `pytestmark = pytest.mark.lab`.)

    peer = start_in(peers, lab, site, "p0", *serve_args(path, "0:10"), "--new-swarm")
    got = chat_in(lab, home, path, dht.maddrs, PROMPT, 32)   # {"text": ..., "telemetry": {...}}
    done = swarm_in(lab, home, "status", "--model", str(path), "--initial-peers", *dht.maddrs)
    with stream_in(lab, home, path, dht.maddrs, PROMPT, 96) as s:   # a client seen token by token
        for i, first_hop in s.tokens(): ...
        got = s.result()

A peer in a site listens on the site's own address (`--host`); one behind a NAT also needs
`--public-address`, fixed ports and `lab.forward` (see `forwarded_args`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from sim.netlab import Lab, Site
from swarm.localswarm import launch_peer
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


def launch_in(peers: PeerSet, lab: Lab, site: Site, name: str, *args: str) -> PeerProcess:
    """Like `start_in` without waiting: the peer is in `peers.started`; `wait_ready` it later, so
    several peers start at once."""
    peer = launch_peer(peers.root, name, *args, "--host", site.address, launcher=lab.exec_prefix(site))
    peers.started.append(peer)
    return peer


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


class LabStream:
    """A greedy raw completion by a client process inside a site, read token by token as it arrives,
    so a test can act at a given token (kill a relay, a peer) with no sleep: the client waits for
    nobody. Made by `stream_in`; a context manager that ends the client on exit.
    """

    def __init__(self, lab: Lab, site: Site, model_path: Path, initial_peers: list[str], prompt: str, n: int):
        self._stderr = tempfile.TemporaryFile(mode="w+")
        argv = [sys.executable, "-m", "tests.helpers.lab", str(model_path), prompt, str(n), *initial_peers]
        self._proc = lab.spawn(site, argv, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self._watchdog = threading.Timer(CHAT_S, self._proc.kill)  # a hang fails, it does not block
        self._watchdog.daemon = True
        self._watchdog.start()
        self._last: dict | None = None

    def tokens(self) -> Iterator[tuple[int, str]]:
        """Yield (tokens generated so far, 1-based; the peer id of the route's first hop now) as each
        token arrives, until the client prints its result."""
        for line in self._proc.stdout:
            msg = json.loads(line)
            if "text" in msg:
                self._last = msg
                return
            yield msg["i"], msg["first_hop"]

    def result(self) -> dict:
        """{"text": the completion, "telemetry": GenerationTelemetry.to_dict()}, once the client is done.

        Raises:
            AssertionError: the client exited non-zero or printed no result (the message holds its stderr).
        """
        for _ in self.tokens():
            pass
        rc = self._proc.wait()
        self._stderr.seek(0)
        assert rc == 0 and self._last is not None, f"lab client failed ({rc}): {self._stderr.read()[-3000:]}"
        return self._last

    def __enter__(self) -> LabStream:
        return self

    def __exit__(self, *exc) -> None:
        self._watchdog.cancel()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._stderr.close()


def stream_in(lab: Lab, site: Site, model_path: Path, initial_peers: list[str], prompt: str, n: int) -> LabStream:
    """Start a greedy raw completion of `n` tokens by a client inside `site`, read token by token
    (`LabStream`)."""
    return LabStream(lab, site, model_path, initial_peers, prompt, n)


def _stream_client() -> None:
    """The client process of `LabStream`, inside its site: one JSON line per token
    ({"i": n, "first_hop": peer id}), flushed as it comes, then one with the text and telemetry."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompt")
    ap.add_argument("n", type=int)
    ap.add_argument("initial_peers", nargs="+")
    args = ap.parse_args()
    from swarm import Client

    with Client(args.model, initial_peers=args.initial_peers) as client:
        stream = client.stream(args.prompt, max_new_tokens=args.n)
        for i, _ in enumerate(stream, 1):
            print(json.dumps({"i": i, "first_hop": stream.telemetry.route[0].peer_id}), flush=True)
        got = stream.result
    print(json.dumps({"text": got.text, "telemetry": got.telemetry.to_dict()}, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    _stream_client()
