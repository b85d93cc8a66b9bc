"""A whole swarm on this machine: a first peer plus span peers as real `swarm` processes.

Used by `swarm demo` (the README's main job), the integration tests and the benchmarks. Each peer
is an ordinary `swarm dht` / `swarm serve` process with its own SWARM_HOME on 127.0.0.1; readiness
is read from what the process prints (its multiaddrs on stdout, "serving layers" on stderr).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swarm.errors import SwarmError
from swarm.proctree import descendants
from swarm.netaddr import is_ip_maddr

READY_S = 180.0
"""How long a peer may take to load its span, measure itself and announce."""


@dataclass
class PeerProcess:
    """One `swarm` peer process and what it printed.

    Attributes:
        proc: the process.
        home: its SWARM_HOME, holding stdout.log and stderr.log.
        maddrs: multiaddrs it printed (to join through).
        peer_id: its libp2p peer id.
    """

    proc: subprocess.Popen
    home: Path
    maddrs: list[str] = field(default_factory=list)
    peer_id: str = ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Signal the peer and wait for it to exit; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def stderr_text(self) -> str:
        """Everything the peer wrote to stderr so far."""
        return (self.home / "stderr.log").read_text(errors="replace")


def launch_peer(
    root: Path,
    name: str,
    *args: str,
    env: dict | None = None,
    launcher: Sequence[str] = (),
) -> PeerProcess:
    """Start `swarm <args>` with SWARM_HOME=root/name, without waiting (then `wait_ready`).

    Args:
        root: directory for the peers' homes.
        name: the peer's subdirectory.
        args: `swarm` command line, e.g. ("serve", "--layers", "0:10", ...).
        env: extra environment variables.
        launcher: argv prefix that runs the process elsewhere and then execs it, so its pid stays
            the peer's: e.g. `ip netns exec NS` for a site of the network lab (sim/netlab.py).
    """
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "SWARM_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(home / "stdout.log", "w") as out, open(home / "stderr.log", "w") as err:
        proc = subprocess.Popen(
            [*launcher, sys.executable, "-m", "swarm.cli", *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=full_env,
        )
    return PeerProcess(proc, home)


def wait_ready(peer: PeerProcess, ready_marker: str = "serving layers") -> PeerProcess:
    """Wait until a launched peer printed its multiaddrs and `ready_marker` on stderr ("" waits only
    for the multiaddrs); fills in `maddrs` and `peer_id`.

    Raises:
        SwarmError: the process exited or was not ready within READY_S (it is killed then).
    """
    name = peer.home.name
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        maddrs = [ln for ln in (peer.home / "stdout.log").read_text().splitlines() if is_ip_maddr(ln)]
        ready = ready_marker in peer.stderr_text() if ready_marker else bool(maddrs)
        if maddrs and ready:
            peer.maddrs = maddrs
            peer.peer_id = maddrs[0].rsplit("/p2p/", 1)[1]
            return peer
        if peer.proc.poll() is not None:
            raise SwarmError(
                f"peer {name} exited with status {peer.proc.returncode}: {_last_line(peer.stderr_text())}"
            )
        time.sleep(0.1)
    peer.stop(signal.SIGKILL)
    raise SwarmError(f"peer {name} was not ready within {READY_S:.0f} s: {_last_line(peer.stderr_text())}")


def start_peer(
    root: Path,
    name: str,
    *args: str,
    ready_marker: str = "serving layers",
    env: dict | None = None,
    launcher: Sequence[str] = (),
) -> PeerProcess:
    """Start `swarm <args>` with SWARM_HOME=root/name and wait until it is ready (`launch_peer`, then
    `wait_ready`, whose errors it raises)."""
    return wait_ready(launch_peer(root, name, *args, env=env, launcher=launcher), ready_marker)


class PeerSet:
    """Peers started under one directory, stopped together (last started, first stopped)."""

    def __init__(self, root: Path):
        self.root = root
        self.started: list[PeerProcess] = []

    def start(
        self,
        name: str,
        *args: str,
        ready_marker: str = "serving layers",
        env: dict | None = None,
        launcher: Sequence[str] = (),
    ) -> PeerProcess:
        """Start `swarm <args>` as peer `name` and wait until it is ready (see `start_peer`)."""
        peer = start_peer(self.root, name, *args, ready_marker=ready_marker, env=env, launcher=launcher)
        self.started.append(peer)
        return peer

    def start_together(self, peers: Sequence[tuple[str, Sequence[str]]], ready_marker: str = "serving layers",
                       launcher: Sequence[str] = ()) -> list[PeerProcess]:
        """Start several peers at once, `(name, args)` each, and wait until all are ready: their
        loading, self-measurement and DHT joins overlap instead of adding up.

        Raises:
            SwarmError: one of them failed (all of them stay in `started`, so `stop_all` stops them).
        """
        launched = [launch_peer(self.root, name, *args, launcher=launcher) for name, args in peers]
        self.started.extend(launched)
        return [wait_ready(peer, ready_marker) for peer in launched]

    def stop_all(self) -> None:
        """SIGTERM every peer and wait for each."""
        for peer in reversed(self.started):
            peer.stop()


def even_spans(n_layers: int, n_spans: int) -> list[tuple[int, int]]:
    """Cut [0, n_layers) into `n_spans` contiguous spans whose sizes differ by at most one."""
    if not 1 <= n_spans <= n_layers:
        raise SwarmError(f"cannot cut {n_layers} layers into {n_spans} spans")
    bounds = [round(i * n_layers / n_spans) for i in range(n_spans + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def start_local_swarm(
    root: Path, model_path: Path, n_layers: int, n_spans: int, threads: int = 1, cache_tokens: int = 16384
) -> PeerSet:
    """A first DHT peer plus `n_spans` serving peers covering the model.

    Args:
        cache_tokens: each peer's KV cells; each of its 8 sessions holds an eighth (2,048 tokens by
            default), the longest prompt + answer one session can have.
    Raises:
        SwarmError: a peer failed to start (the ones already started are stopped).
    """
    peers = PeerSet(root)
    try:
        first = peers.start("dht", "dht", ready_marker="")
        peers.start_together([
            (f"span{i}", ("serve", "--model", str(model_path), "--layers", f"{a}:{b}", "--threads", str(threads),
                          "--cache-tokens", str(cache_tokens), "--initial-peers", first.maddrs[0]))
            for i, (a, b) in enumerate(even_spans(n_layers, n_spans))
        ])
    except BaseException:
        peers.stop_all()
        raise
    return peers


def signal_tree(peer: PeerProcess, sig: int) -> None:
    """Send `sig` to a peer and every process under it (its p2pd daemons): the whole machine
    dies (SIGKILL) or freezes (SIGSTOP), so no part of the peer can answer or say goodbye."""
    for pid in [*descendants(peer.proc.pid), peer.proc.pid]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
