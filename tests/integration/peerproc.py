"""Real `swarm serve` / `swarm dht` processes on 127.0.0.1, each with its own SWARM_HOME."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

READY_S = 120.0


@dataclass
class PeerProcess:
    """One `swarm serve` (or `swarm dht`) process and what it printed."""

    proc: subprocess.Popen
    home: Path
    maddrs: list[str] = field(default_factory=list)
    peer_id: str = ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
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
        return (self.home / "stderr.log").read_text(errors="replace")


def start_peer(tmp_path: Path, name: str, *args: str, ready_marker: str = "serving layers") -> PeerProcess:
    """Start `swarm <args>` with its own SWARM_HOME; wait until it prints its multiaddrs and `ready_marker`."""
    home = tmp_path / name
    home.mkdir(parents=True)
    out = open(home / "stdout.log", "w")
    err = open(home / "stderr.log", "w")
    env = {**os.environ, "SWARM_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", *args], stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, env=env)
    peer = PeerProcess(proc, home)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        text = (home / "stdout.log").read_text()
        maddrs = [ln for ln in text.splitlines() if ln.startswith("/ip4/")]
        ready = ready_marker in peer.stderr_text() if ready_marker else bool(maddrs)
        if maddrs and ready:
            peer.maddrs = maddrs
            peer.peer_id = maddrs[0].rsplit("/p2p/", 1)[1]
            return peer
        if proc.poll() is not None:
            raise RuntimeError(f"peer {name} exited with {proc.returncode}:\n{peer.stderr_text()[-3000:]}")
        time.sleep(0.1)
    peer.stop(signal.SIGKILL)
    raise RuntimeError(f"peer {name} not ready within {READY_S} s:\n{peer.stderr_text()[-3000:]}")


class PeerSet:
    """Peers started under one directory, stopped together."""

    def __init__(self, root: Path):
        self.root = root
        self.started: list[PeerProcess] = []

    def start(self, name: str, *args: str, ready_marker: str = "serving layers") -> PeerProcess:
        """Start `swarm <args>` as peer `name` and wait until it is ready."""
        peer = start_peer(self.root, name, *args, ready_marker=ready_marker)
        self.started.append(peer)
        return peer

    def stop_all(self) -> None:
        for peer in reversed(self.started):
            peer.stop()
