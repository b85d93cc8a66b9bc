"""A client's connection to the swarm: its DHT node (client mode, throwaway identity) on a loop thread.

This module does not: read a model's announcements for planning (swarm/client/directory.py) or
open span streams (swarm/client/streams.py).
"""

from __future__ import annotations

import tempfile

from swarm.client.loop import LoopThread
from swarm.dht.node import SwarmDHT
from swarm.dht.records import Announcement
from swarm.errors import SwarmError


class SwarmConnection:
    """A client's DHT node (client mode, throwaway identity) on its own loop thread.

    Args:
        initial_peers: multiaddrs to join through (at least one).
    Raises:
        SwarmError: no initial peers, or the DHT node could not start.
    """

    def __init__(self, initial_peers: list[str]):
        if not initial_peers:
            raise SwarmError(
                "no initial peers: pass --initial-peers MADDR (printed by `swarm dht` or "
                "`swarm serve --new-swarm`)"
            )
        self._tmp = tempfile.TemporaryDirectory(prefix="swarm-client-")
        self.loop = LoopThread()
        try:
            self.dht: SwarmDHT = self.loop.run(
                SwarmDHT.start(initial_peers, client_mode=True, data_dir=self._tmp.name), timeout_s=60
            )
        except BaseException:
            self.loop.stop()
            self._tmp.cleanup()
            raise

    def announcements(self, model_id: str, n_layers: int | None = None) -> list[Announcement]:
        """Live announcements for the model, as the DHT has them now (spans ending past `n_layers`,
        when given, dropped)."""
        return self.loop.run(self.dht.get_announcements(model_id, n_layers), timeout_s=30)

    def close(self) -> None:
        """Leave the DHT and stop the loop thread (idempotent)."""
        if self._tmp is None:
            return
        try:
            self.loop.run(self.dht.shutdown(), timeout_s=30)
        finally:
            self.loop.stop()
            self._tmp.cleanup()
            self._tmp = None
