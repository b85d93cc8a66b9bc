"""`swarm status`: who serves which layers of a model, whether they chain into a route, how fast,
and which peers this machine's clients caught computing wrong (spot checks, swarm/client/checks.py).

A peer's record outlives the peer: one killed with -9 stays announced until its record expires, so
`swarm status` pings every announced peer and counts only those that answer. Layers that only
silent peers announce are "announced but unreachable" (with the likely cause: the reachability
those peers announce, swarm/reach_rules.py), not "not covered". A peer that answers is reached
"direct" when one of its direct endpoints accepts a TCP connection, else through "libp2p": the
transport a client's stream to it would take (swarm/direct.py), or "relayed" for a peer that
announces only relay addresses (pinged through its relay, swarm/relay). Each libp2p answer carries
the peer's wall time: a clock far from the others' median is shown (a warning line, and
`clock_skew_s` in the JSON).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from swarm.artifacts.distribute import find_manifest
from swarm.client.checks import read_evidence
from swarm.client.connection import SwarmConnection
from swarm.dht.clock import SKEW_WARN_S, relative_skews, skew_against
from swarm.dht.identity import resolve_data_dir
from swarm.dht.records import Announcement
from swarm.direct import tcp_answers
from swarm.manifest import Manifest, build_manifest
from swarm.models import is_model_id, resolve_model
from swarm.errors import NoRoute, SwarmError
from swarm.route.chains import ChainReport, analyze_chains
from swarm.route.plan import RoutePlan, layer_ranges, plan_route
from swarm.route.snapshot import peer_spans
from swarm.reach_rules import unreachable_words
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
        best_route: the planner's route over peers with a free session slot (compute cost plus the
            measured ping RTT; 0 where none was measured), or None when there is none.
        no_route: why `best_route` is None (the planner's NoRoute message), else None.
        rtt_ms: peer id -> ping round trip in ms, None for a peer that did not answer; empty when
            nobody was pinged. Peers that did not answer are left out of `chains` and `best_route`.
        transport: peer id -> "direct", "libp2p" or "relayed", how a stream to the peer would go
            (peers that answered a ping); empty when not measured.
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
    transport: dict[str, str] = field(default_factory=dict)
    caught: tuple[dict, ...] = ()
    clock_s: dict[str, float] = field(default_factory=dict)

    @property
    def silent(self) -> list[Announcement]:
        """Announced peers that did not answer a ping (crashed, frozen or unreachable)."""
        return [p for p in self.peers if p.peer_id in self.rtt_ms and self.rtt_ms[p.peer_id] is None]

    @property
    def unreachable_layers(self) -> list[int]:
        """Layers no answering peer serves but a silent one announces: announced but unreachable."""
        silent = self.silent
        return [m for m in self.chains.missing if any(p.start <= m < p.end for p in silent)]

    @property
    def uncovered_layers(self) -> list[int]:
        """Layers nobody announces at all."""
        unreachable = set(self.unreachable_layers)
        return [m for m in self.chains.missing if m not in unreachable]

    def unreachable_why(self) -> str:
        """The likely cause of the silent peers' silence and the fix ("" when none is silent)."""
        silent = self.silent
        return unreachable_words([p.reachability for p in silent]) if silent else ""

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
                "transports": [self.transport.get(h.peer_id, "") for h in self.best_route.hops],
            },
            "no_route": self.no_route,
            "unreachable_layers": self.unreachable_layers,
            "uncovered_layers": self.uncovered_layers,
            "unreachable_why": self.unreachable_why(),
            "dead_ends": [dataclasses.asdict(d) for d in self.chains.dead_ends],
            "peers": [
                {**dataclasses.asdict(p), "answered": self.rtt_ms.get(p.peer_id, 0.0) is not None,
                 "rtt_ms": self.rtt_ms.get(p.peer_id), "transport": self.transport.get(p.peer_id, ""),
                 "clock_skew_s": self.clock_s.get(p.peer_id)}
                for p in self.peers
            ],
            "caught": list(self.caught),
        }

    def print_table(self, console: Console | None = None) -> None:
        """Human table and route verdict (stdout by default); the table fits 80 columns."""
        dead = {d.peer_id for d in self.chains.dead_ends}
        silent = self.silent
        table = Table(title=f"model {self.model_id[:16]}… ({self.n_layers} layers)", box=None,
                      padding=(0, 1), header_style="bold")
        for col, right in (("peer", False), ("layers", False), ("dec/s", True), ("free kv", True),
                           ("slots", True), ("rtt ms", True), ("via", False), ("state", False),
                           ("name", False)):
            table.add_column(col, justify="right" if right else "left", no_wrap=True,
                             overflow="ellipsis", max_width=12 if col == "name" else None)
        for p in self.peers:
            ms = self.rtt_ms.get(p.peer_id)
            table.add_row(
                p.peer_id[:10] + "…",
                f"{p.start}:{p.end}",
                f"{p.decode_steps_per_s:.1f}",
                str(p.free_cache_tokens),
                f"{p.sessions_free}/{p.max_sessions}",
                "" if p.peer_id not in self.rtt_ms else "–" if ms is None else f"{ms:.1f}",
                self.transport.get(p.peer_id, "") or ("–" if p in silent else ""),
                "no answer" if p in silent else "dead end" if p.peer_id in dead else "ok",
                p.public_name or "",
            )
        console = console or Console()
        console.print(table)
        for line in self.verdict():
            console.print(line, highlight=False)

    def verdict(self) -> list[str]:
        """Plain-text lines: coverage, whether a route exists, its speed, and each dead end."""
        lines = ["all layers covered"] if self.covered else []
        if self.unreachable_layers:
            serving = [p for p in self.silent if any(p.start <= m < p.end for m in self.unreachable_layers)]
            lines.append(
                f"layers {layer_ranges(self.unreachable_layers)} announced but unreachable: {len(serving)} "
                f"peer(s) serving them did not answer ({unreachable_words([p.reachability for p in serving])})"
            )
        if self.uncovered_layers:
            lines.append(f"layers not covered: {layer_ranges(self.uncovered_layers)}")
        if not self.chains.complete:
            lines.append("no route: no chain of whole spans joins layer 0 to the last layer")
        elif self.best_route is None:
            lines.append(f"a complete chain exists, but no route now: {self.no_route}")
        else:
            hops = " → ".join(
                f"{h.start}:{h.end} ({h.peer_id[:12]}…" + (f", {self.transport[h.peer_id]})"
                                                           if self.transport.get(h.peer_id) else ")")
                for h in self.best_route.hops
            )
            lines.append(
                f"route exists: best {hops}, ~{self.best_route_tokens_per_s:.1f} tokens/s per session "
                f"(compute + measured rtt); swarm capacity ~{self.chains.routable_tokens_per_s:.1f} tokens/s"
            )
        for d in self.chains.dead_ends:
            lines.append(f"dead end: {d.start}:{d.end} on {d.peer_id[:16]}… ({_DEAD_END_WORDS[d.reason]})")
        for p in self.peers:
            skew = self.clock_s.get(p.peer_id, 0.0)
            if abs(skew) > SKEW_WARN_S:
                lines.append(f"clock: {p.peer_id[:16]}…'s clock is {skew_against(skew, 'the median')} "
                             "(it writes its records in the swarm's time; set its clock with NTP)")
        for p in self.silent:
            lines.append(f"no answer: {p.start}:{p.end} on {p.peer_id[:16]}… is announced (reachability "
                         f"{p.reachability}) but did not answer a ping ({unreachable_words([p.reachability])}; "
                         "a dead peer's record lapses when it expires)")
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


PING_TIMEOUT_S = 3.0
"""How long `swarm status` waits for one announced peer to answer a ping, seconds."""


def status_report(
    model_id: str,
    n_layers: int,
    announcements,
    rtt_ms: dict[str, float | None] | None = None,
    transport: dict[str, str] | None = None,
    clock_offsets_s: dict[str, float] | None = None,
    caught: tuple[dict, ...] = (),
) -> StatusReport:
    """Analyse announcements of one model (pure).

    Args:
        announcements: `Announcement`s read from the DHT.
        rtt_ms: ping results by peer id (None: no answer); peers without an answer are left out of
            the route analysis. None: nobody was pinged, every announcement counts.
        transport: peer id -> "direct", "libp2p" or "relayed" (see StatusReport.transport).
        clock_offsets_s: peer id -> its wall time minus this observer's, seconds, for peers that
            answered with a time (swarm.dht.clock).
        caught: spot-check evidence of this machine's clients (`StatusReport.caught`).
    """
    rtt_ms = dict(rtt_ms or {})
    peers = tuple(sorted(announcements, key=lambda a: (a.start, a.end, a.peer_id)))
    measured = {p: math.inf if ms is None else ms for p, ms in rtt_ms.items()}  # inf: "unreachable"
    answered = peer_spans([p for p in peers if rtt_ms.get(p.peer_id, 0.0) is not None], measured)
    best, why = None, None
    try:
        best = plan_route(peer_spans(peers, measured), n_layers, need_tokens=1, default_rtt_ms=0.0)
    except NoRoute as e:
        why = str(e)
    return StatusReport(model_id, n_layers, peers, analyze_chains(answered, n_layers), best, why, rtt_ms,
                        dict(transport or {}), caught, relative_skews(clock_offsets_s or {}))


def swarm_status(model: str, initial_peers: list[str]) -> StatusReport:
    """Read the model's announcements through a throwaway client DHT node, and ping every peer.

    Raises:
        ModelError, SwarmError: model or DHT problems.
    """
    conn = SwarmConnection(initial_peers)
    try:
        manifest = model_manifest(conn, model)
        peers = conn.announcements(manifest.model_id, manifest.n_layers)
        probes = conn.loop.run(probe_peers(conn, peers), timeout_s=PING_TIMEOUT_S * 4)
    finally:
        conn.close()
    caught = read_evidence(resolve_data_dir(None), manifest.model_id)
    return status_report(manifest.model_id, manifest.n_layers, peers, probes.rtt_ms, probes.transport,
                         probes.clock_offsets_s, caught)


class Probes(NamedTuple):
    """What `probe_peers` measured.

    Attributes:
        rtt_ms: peer id -> ping round trip in ms, None: no answer.
        transport: peer id -> "direct", "libp2p" or "relayed", for the peers that answered.
        clock_offsets_s: peer id -> its wall time minus this machine's, seconds, for peers that
            answered a libp2p ping with a time.
    """

    rtt_ms: dict[str, float | None]
    transport: dict[str, str]
    clock_offsets_s: dict[str, float]


async def probe_peers(conn: SwarmConnection, peers) -> Probes:
    """Ping each announced peer: at its announced addresses (asking for its wall time), or through its
    relay when it announces one (swarm.relay); then try a TCP connection to the direct endpoints of
    those that answered over libp2p."""
    identity = RelayIdentity(conn.dht.identity.private_key) if any(a.relay_addrs for a in peers) else None

    async def ping(a: Announcement):
        try:
            async with asyncio.timeout(PING_TIMEOUT_S * 2):  # dialling has no timeout of its own
                if a.relay_addrs:
                    return await relay_dial.ping(identity, a.relay_addrs, a.peer_id, timeout_s=PING_TIMEOUT_S), None
                return await conn.dht.transport.probe(a.peer_id, a.addrs, timeout_s=PING_TIMEOUT_S)
        except (SwarmError, TimeoutError):
            return None, None

    async def via(a: Announcement) -> str:
        if a.relay_addrs:
            return "relayed"
        return "direct" if await tcp_answers(a.direct_addrs, PING_TIMEOUT_S) else "libp2p"

    answers = await asyncio.gather(*(ping(a) for a in peers))
    answered = [a for a, (ms, _) in zip(peers, answers) if ms is not None]
    ways = await asyncio.gather(*(via(a) for a in answered))
    return Probes(
        {a.peer_id: ms for a, (ms, _) in zip(peers, answers)},
        {a.peer_id: w for a, w in zip(answered, ways)},
        {a.peer_id: c.offset_s for a, (_, c) in zip(peers, answers) if c is not None},
    )


def model_manifest(conn: SwarmConnection, model: str) -> Manifest:
    """The manifest of `model`: built from the local file of a name or path, or read from the DHT
    for a model_id.

    Raises:
        ModelError, ArtifactError, SwarmError: unknown model, unreadable file, or no manifest in the DHT.
    """
    if is_model_id(model):
        return conn.loop.run(find_manifest(conn.dht, model), timeout_s=60)
    return build_manifest(resolve_model(model, progress=True))
