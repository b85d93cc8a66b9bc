"""`swarm status`: who serves which layers of a model, how fast, and what is not covered."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from swarm.artifacts.distribute import find_manifest
from swarm.client.remote import SwarmConnection
from swarm.dht.records import Announcement
from swarm.manifest import build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.route.plan import layer_ranges


@dataclass(frozen=True)
class StatusReport:
    """Announcements of one model and the layers no peer serves.

    Attributes:
        model_id: the model.
        n_layers: layers in the model.
        peers: live announcements, sorted by span start.
        missing: global layer indices no live peer serves.
    """

    model_id: str
    n_layers: int
    peers: tuple[Announcement, ...]
    missing: tuple[int, ...]

    @property
    def covered(self) -> bool:
        """Every layer has at least one live peer."""
        return not self.missing

    def to_dict(self) -> dict:
        """JSON-able form (for --json)."""
        return {
            "model_id": self.model_id,
            "n_layers": self.n_layers,
            "covered": self.covered,
            "missing": list(self.missing),
            "peers": [dataclasses.asdict(p) for p in self.peers],
        }

    def print_table(self) -> None:
        """Human table on stdout."""
        table = Table(title=f"model {self.model_id[:16]}… ({self.n_layers} layers)")
        for col in (
            "peer",
            "layers",
            "decode steps/s",
            "prefill tok/s",
            "free cache",
            "sessions free",
            "name",
        ):
            table.add_column(col)
        for p in self.peers:
            table.add_row(
                p.peer_id[:16] + "…",
                f"{p.start}:{p.end}",
                f"{p.decode_steps_per_s:.1f}",
                f"{p.prefill_tokens_per_s:.0f}",
                str(p.free_cache_tokens),
                f"{p.sessions_free}/{p.max_sessions}",
                p.public_name or "",
            )
        console = Console()
        console.print(table)
        console.print(
            "all layers covered" if self.covered else f"layers not covered: {layer_ranges(self.missing)}"
        )


def missing_layers(peers, n_layers: int) -> tuple[int, ...]:
    """Layers in [0, n_layers) that no span in `peers` covers."""
    covered = set()
    for p in peers:
        covered.update(range(max(0, p.start), min(n_layers, p.end)))
    return tuple(i for i in range(n_layers) if i not in covered)


def swarm_status(model: str, initial_peers: list[str]) -> StatusReport:
    """Read the model's announcements through a throwaway client DHT node.

    Raises:
        ModelError, SwarmError: model or DHT problems.
    """
    conn = SwarmConnection(initial_peers)
    try:
        if is_model_id(model):
            manifest = conn.loop.run(find_manifest(conn.dht, model), timeout_s=60)
        else:
            manifest = build_manifest(resolve_model(model, progress=True))
        peers = conn.announcements(manifest.model_id)
    finally:
        conn.close()
    return StatusReport(
        manifest.model_id, manifest.n_layers, tuple(peers), missing_layers(peers, manifest.n_layers)
    )
