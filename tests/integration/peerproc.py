"""Real peer processes for tests: the same helpers `swarm demo` uses (swarm/localswarm.py)."""

from swarm.localswarm import PeerProcess, PeerSet, start_peer

__all__ = ["PeerProcess", "PeerSet", "start_peer"]
