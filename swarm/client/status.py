"""`swarm status`: who serves which layers of a model, whether they chain into a route, how fast."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from swarm.artifacts.distribute import find_manifest
from swarm.client.remote import SwarmConnection
from swarm.dht.records import Announcement
from swarm.manifest import Manifest, build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.errors import NoRoute
from swarm.route.chains import ChainReport, analyze_chains
from swarm.route.plan import RoutePlan, layer_ranges, plan_route
from swarm.route.snapshot import peer_spans


@dataclass(frozen=True)
class StatusReport:
    """A model's announcements and what they can route.

    Attributes:
        model_id: the model.
        n_layers: layers in the model.
        peers: live announcements, sorted by span start.
        chains: complete chains, dead ends and routable throughput (`swarm.route.chains`).
        best_route: the planner's route over peers with a free session slot (compute cost plus
            no network: status measures no RTTs), or None when there is none.
        no_route: why `best_route` is None (the planner's NoRoute message), else None.
    """

    model_id: str
    n_layers: int
    peers: tuple[Announcement, ...]
    chains: ChainReport
    best_route: RoutePlan | None
    no_route: str | None

    @property
    def covered(self) -> bool:
        """Every layer has at least one live peer."""
        return not self.chains.missing

    @property
    def best_route_tokens_per_s(self) -> float | None:
        """One session's estimated decode speed on the best route, tokens/s (compute only)."""
        return None if self.best_route is None else 1000.0 / self.best_route.total_ms

    def to_dict(self) -> dict:
        """JSON-able form (for --json)."""
        return {
            "model_id": self.model_id,
            "n_layers": self.n_layers,
            "covered": self.covered,
            "missing": list(self.chains.missing),
            "route_exists": self.chains.complete,
            "routable_tokens_per_s": self.chains.routable_tokens_per_s,
            "best_route": None
            if self.best_route is None
            else {
                "tokens_per_s": self.best_route_tokens_per_s,
                "hops": [[h.peer_id, h.start, h.end] for h in self.best_route.hops],
            },
            "no_route": self.no_route,
            "dead_ends": [dataclasses.asdict(d) for d in self.chains.dead_ends],
            "peers": [dataclasses.asdict(p) for p in self.peers],
        }

    def print_table(self) -> None:
        """Human table and route verdict on stdout."""
        dead = {d.peer_id: d.reason for d in self.chains.dead_ends}
        table = Table(title=f"model {self.model_id[:16]}… ({self.n_layers} layers)")
        for col in (
            "peer",
            "layers",
            "decode steps/s",
            "prefill tok/s",
            "free cache",
            "sessions free",
            "chain",
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
                f"dead end ({_DEAD_END_WORDS[dead[p.peer_id]]})" if p.peer_id in dead else "ok",
                p.public_name or "",
            )
        console = Console()
        console.print(table)
        for line in self.verdict():
            console.print(line, highlight=False)

    def verdict(self) -> list[str]:
        """Plain-text lines: coverage, whether a route exists, its speed, and each dead end."""
        lines = [
            "all layers covered"
            if self.covered
            else f"layers not covered: {layer_ranges(self.chains.missing)}"
        ]
        if not self.chains.complete:
            lines.append("no route: no chain of whole spans joins layer 0 to the last layer")
        elif self.best_route is None:
            lines.append(f"a complete chain exists, but no route now: {self.no_route}")
        else:
            hops = " → ".join(f"{h.start}:{h.end}" for h in self.best_route.hops)
            lines.append(
                f"route exists: best {hops}, ~{self.best_route_tokens_per_s:.1f} tokens/s per session "
                f"(compute only); swarm capacity ~{self.chains.routable_tokens_per_s:.1f} tokens/s"
            )
        for d in self.chains.dead_ends:
            lines.append(f"dead end: {d.start}:{d.end} on {d.peer_id[:16]}… ({_DEAD_END_WORDS[d.reason]})")
        return lines


_DEAD_END_WORDS = {
    "unreachable": "no span ends where it starts",
    "no_exit": "no chain leads from its end to the last layer",
    "unreachable+no_exit": "no chain reaches it or leaves it",
}


def status_report(model_id: str, n_layers: int, announcements) -> StatusReport:
    """Analyse announcements of one model (pure).

    Args:
        announcements: `Announcement`s read from the DHT.
    """
    peers = tuple(sorted(announcements, key=lambda a: (a.start, a.end, a.peer_id)))
    spans = peer_spans(peers)
    best, why = None, None
    try:
        best = plan_route(spans, n_layers, need_tokens=1, default_rtt_ms=0.0)
    except NoRoute as e:
        why = str(e)
    return StatusReport(model_id, n_layers, peers, analyze_chains(spans, n_layers), best, why)


def swarm_status(model: str, initial_peers: list[str]) -> StatusReport:
    """Read the model's announcements through a throwaway client DHT node.

    Raises:
        ModelError, SwarmError: model or DHT problems.
    """
    conn = SwarmConnection(initial_peers)
    try:
        manifest = model_manifest(conn, model)
        peers = conn.announcements(manifest.model_id)
    finally:
        conn.close()
    return status_report(manifest.model_id, manifest.n_layers, peers)


def model_manifest(conn: SwarmConnection, model: str) -> Manifest:
    """The manifest of `model`: built from the local file of a name or path, or read from the DHT
    for a model_id.

    Raises:
        ModelError, ArtifactError, SwarmError: unknown model, unreadable file, or no manifest in the DHT.
    """
    if is_model_id(model):
        return conn.loop.run(find_manifest(conn.dht, model), timeout_s=60)
    return build_manifest(resolve_model(model, progress=True))
