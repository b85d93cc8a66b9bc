"""`swarm status`: who serves which layers of a model, whether they chain into a route, how fast,
and which peers this machine's clients caught computing wrong (spot checks, swarm/client/checks.py).

A peer's record outlives the peer: one killed with -9 stays announced until its record expires, so
`swarm status` pings every announced peer and counts only those that answer. Each answer carries the
peer's wall time: a clock far from the others' median is shown (column "clock" and a warning line).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from swarm.artifacts.distribute import find_manifest
from swarm.client.checks import read_evidence
from swarm.client.connection import SwarmConnection
from swarm.dht.identity import resolve_data_dir
from swarm.dht.clock import SKEW_WARN_S, relative_skews, skew_against, skew_words
from swarm.dht.records import Announcement
from swarm.manifest import Manifest, build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.errors import NoRoute, SwarmError
from swarm.route.chains import ChainReport, analyze_chains
from swarm.route.plan import RoutePlan, layer_ranges, plan_route
from swarm.route.snapshot import peer_spans
from swarm.relay import dial as relay_dial
from swarm.relay.handshake import RelayIdentity


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
        rtt_ms: peer id -> ping round trip in ms, None for a peer that did not answer; empty when
            nobody was pinged. Peers that did not answer are left out of `chains` and `best_route`.
        caught: evidence of peers this machine's clients caught computing wrong in spot checks
            (`swarm.client.checks.read_evidence`: dicts of a `CheckEvent` plus `at`, Unix seconds).
        clock_s: peer id -> its clock minus the median clock of the peers that answered with a time,
            seconds (positive: ahead); peers that did not are absent.
    """

    model_id: str
    n_layers: int
    peers: tuple[Announcement, ...]
    chains: ChainReport
    best_route: RoutePlan | None
    no_route: str | None
    rtt_ms: dict[str, float | None] = field(default_factory=dict)
    caught: tuple[dict, ...] = ()
    clock_s: dict[str, float] = field(default_factory=dict)

    @property
    def silent(self) -> list[Announcement]:
        """Announced peers that did not answer a ping (crashed, frozen or unreachable)."""
        return [p for p in self.peers if p.peer_id in self.rtt_ms and self.rtt_ms[p.peer_id] is None]

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
            "peers": [
                {**dataclasses.asdict(p), "answered": self.rtt_ms.get(p.peer_id, 0.0) is not None,
                 "rtt_ms": self.rtt_ms.get(p.peer_id), "clock_skew_s": self.clock_s.get(p.peer_id)}
                for p in self.peers
            ],
            "caught": list(self.caught),
        }

    def print_table(self) -> None:
        """Human table and route verdict on stdout."""
        dead = {d.peer_id: d.reason for d in self.chains.dead_ends}
        silent = self.silent
        table = Table(title=f"model {self.model_id[:16]}… ({self.n_layers} layers)")
        clocks = bool(self.clock_s)  # a column only when some peer told its time
        cols = ("peer", "layers", "decode steps/s", "prefill tok/s", "free cache", "sessions free", "rtt")
        for col in cols + ("clock",) * clocks + ("chain", "name"):
            table.add_column(col)
        for p in self.peers:
            clock = (skew_words(self.clock_s[p.peer_id]) if p.peer_id in self.clock_s else "",) * clocks
            table.add_row(
                p.peer_id[:16] + "…",
                f"{p.start}:{p.end}",
                f"{p.decode_steps_per_s:.1f}",
                f"{p.prefill_tokens_per_s:.0f}",
                str(p.free_cache_tokens),
                f"{p.sessions_free}/{p.max_sessions}",
                _rtt_words(self.rtt_ms, p.peer_id) + (" (relayed)" if p.relay_addrs else ""),
                *clock,
                "no answer" if p in silent
                else f"dead end ({_DEAD_END_WORDS[dead[p.peer_id]]})" if p.peer_id in dead else "ok",
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
            hops = " → ".join(f"{h.start}:{h.end} ({h.peer_id[:12]}…)" for h in self.best_route.hops)
            lines.append(
                f"route exists: best {hops}, ~{self.best_route_tokens_per_s:.1f} tokens/s per session "
                f"(compute only); swarm capacity ~{self.chains.routable_tokens_per_s:.1f} tokens/s"
            )
        for d in self.chains.dead_ends:
            lines.append(f"dead end: {d.start}:{d.end} on {d.peer_id[:16]}… ({_DEAD_END_WORDS[d.reason]})")
        for p in self.peers:
            skew = self.clock_s.get(p.peer_id, 0.0)
            if abs(skew) > SKEW_WARN_S:
                lines.append(f"clock: {p.peer_id[:16]}…'s clock is {skew_against(skew, 'the median')} "
                             "(it writes its records in the swarm's time; set its clock with NTP)")
        for p in self.silent:
            lines.append(f"no answer: {p.start}:{p.end} on {p.peer_id[:16]}… is announced but did not answer "
                         "a ping (crashed, frozen or unreachable; its record lapses when it expires)")
        for c in self.caught:
            lines.append(
                f"caught computing wrong (a spot check of this machine's client): {c['start']}:{c['end']} on "
                f"{c['peer_id'][:16]}… at position {c['position']}: rel L2 {c['rel_l2']:.3g} outside the band "
                f"{c['max_rel_l2']:.3g}, cosine {c['cosine']:.6f}; offence {c['offences']} of this client"
            )
        return lines


_DEAD_END_WORDS = {
    "unreachable": "no span ends where it starts",
    "no_exit": "no chain leads from its end to the last layer",
    "unreachable+no_exit": "no chain reaches it or leaves it",
}


def _rtt_words(rtt_ms: dict[str, float | None], peer_id: str) -> str:
    if peer_id not in rtt_ms:
        return ""
    ms = rtt_ms[peer_id]
    return "no answer" if ms is None else f"{ms:.1f} ms"


PING_TIMEOUT_S = 3.0
"""How long `swarm status` waits for one announced peer to answer a ping, seconds."""


def status_report(
    model_id: str,
    n_layers: int,
    announcements,
    rtt_ms: dict[str, float | None] | None = None,
    clock_offsets_s: dict[str, float] | None = None,
    caught: tuple[dict, ...] = (),
) -> StatusReport:
    """Analyse announcements of one model (pure).

    Args:
        announcements: `Announcement`s read from the DHT.
        rtt_ms: ping results by peer id (None: no answer); peers without an answer are left out of
            the route analysis. None: nobody was pinged, every announcement counts.
        clock_offsets_s: peer id -> its wall time minus this observer's, seconds, for peers that
            answered with a time (swarm.dht.clock).
        caught: spot-check evidence of this machine's clients (`StatusReport.caught`).
    """
    rtt_ms = dict(rtt_ms or {})
    peers = tuple(sorted(announcements, key=lambda a: (a.start, a.end, a.peer_id)))
    spans = peer_spans([p for p in peers if rtt_ms.get(p.peer_id, 0.0) is not None])
    best, why = None, None
    try:
        if peers and not spans:
            raise NoRoute("no announced peer answered a ping")
        best = plan_route(spans, n_layers, need_tokens=1, default_rtt_ms=0.0)
    except NoRoute as e:
        why = str(e)
    return StatusReport(model_id, n_layers, peers, analyze_chains(spans, n_layers), best, why, rtt_ms,
                        caught=caught, clock_s=relative_skews(clock_offsets_s or {}))


def swarm_status(model: str, initial_peers: list[str]) -> StatusReport:
    """Read the model's announcements through a throwaway client DHT node, and ping every peer.

    Raises:
        ModelError, SwarmError: model or DHT problems.
    """
    conn = SwarmConnection(initial_peers)
    try:
        manifest = model_manifest(conn, model)
        peers = conn.announcements(manifest.model_id, manifest.n_layers)
        rtt_ms, offsets = conn.loop.run(_ping_all(conn, peers), timeout_s=PING_TIMEOUT_S * 4)
    finally:
        conn.close()
    caught = read_evidence(resolve_data_dir(None), manifest.model_id)
    return status_report(manifest.model_id, manifest.n_layers, peers, rtt_ms, offsets, caught)


async def _ping_all(conn: SwarmConnection, peers) -> tuple[dict[str, float | None], dict[str, float]]:
    """Ping each announced peer at its announced addresses, or through its relay when it announces one
    (swarm.relay). Returns (round trip in ms by peer id, None: no answer; the peer's wall time minus
    this machine's in s, for peers that answered a libp2p ping with a time)."""
    identity = RelayIdentity(conn.dht.identity.private_key) if any(a.relay_addrs for a in peers) else None

    async def ping(a: Announcement):
        try:
            async with asyncio.timeout(PING_TIMEOUT_S * 2):  # dialling has no timeout of its own
                if a.relay_addrs:
                    return await relay_dial.ping(identity, a.relay_addrs, a.peer_id, timeout_s=PING_TIMEOUT_S), None
                return await conn.dht.transport.probe(a.peer_id, a.addrs, timeout_s=PING_TIMEOUT_S)
        except (SwarmError, TimeoutError):
            return None, None

    answers = await asyncio.gather(*(ping(a) for a in peers))
    rtt_ms = {a.peer_id: ms for a, (ms, _) in zip(peers, answers)}
    return rtt_ms, {a.peer_id: c.offset_s for a, (_, c) in zip(peers, answers) if c is not None}


def model_manifest(conn: SwarmConnection, model: str) -> Manifest:
    """The manifest of `model`: built from the local file of a name or path, or read from the DHT
    for a model_id.

    Raises:
        ModelError, ArtifactError, SwarmError: unknown model, unreadable file, or no manifest in the DHT.
    """
    if is_model_id(model):
        return conn.loop.run(find_manifest(conn.dht, model), timeout_s=60)
    return build_manifest(resolve_model(model, progress=True))
