"""A time-stepped simulation of many peers serving many models, driving the real pure planners.

Each simulated peer serves one grid span of one model and admits sessions through a real
`swarm.kv.sessions.SessionTable` sized with `swarm.kv.budget`; clients route with the real
`swarm.route.plan.plan_route` over a per-step snapshot of the announcements. Faults:

- peer death: at `kill_step` a fraction of peers die; their announcements stay visible for
  `record_ttl_steps` more steps (DHT expiry), so clients first meet dead peers and fail over
  (exclude the peer, re-plan), as the real client does;
- capacity exhaustion: the snapshot is taken once per step, so later requests in a step see stale
  free-slot counts, meet `Busy` at admission, and fail over too.

Every run is a function of the scenario (including its seed): no clock, no global RNG, no I/O.
This module does not: import swarm.dht, hivemind, libtorrent or llama.cpp, or model the network
below the per-hop RTT.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from swarm.errors import Busy, NoRoute
from swarm.kv.budget import kv_bytes_per_token, tokens_that_fit
from swarm.kv.sessions import SessionTable
from swarm.route.plan import PeerSpan, plan_route


@dataclass(frozen=True)
class Scenario:
    """Parameters of one simulation run.

    Attributes:
        name: label for reports.
        n_peers: simulated peers (up to ~10,000); grouped into models of `redundancy` peers per span.
        n_layers, span_layers: layers per model and per grid span (n_layers % span_layers == 0).
        redundancy: peers serving each span of each model.
        n_head_kv, head_dim: the model's KV shape, for the KV budget of a peer.
        kv_budget_bytes: bytes each peer gives its KV cache.
        sessions_per_peer: session slots per peer.
        session_tokens: tokens each session reserves.
        session_steps: steps a session lasts before the client closes it.
        steps, requests_per_step: length and load of the run.
        kill_fraction, kill_step: fraction of peers that die at kill_step.
        record_ttl_steps: steps a dead peer's announcement stays visible.
        unknown_rtt_fraction: peers whose RTT the client has not measured.
        max_attempts: plans a client tries per request (failover budget).
        seed: seeds the one RNG of the run.
    """

    name: str
    n_peers: int
    n_layers: int = 30
    span_layers: int = 10
    redundancy: int = 3
    n_head_kv: int = 2
    head_dim: int = 64
    kv_budget_bytes: int = 256 * 1024 * 1024
    sessions_per_peer: int = 8
    session_tokens: int = 2048
    session_steps: int = 5
    steps: int = 20
    requests_per_step: int = 100
    kill_fraction: float = 0.0
    kill_step: int = 5
    record_ttl_steps: int = 3
    unknown_rtt_fraction: float = 0.1
    max_attempts: int = 10
    seed: int = 0


@dataclass
class SimPeer:
    """One simulated peer: a span of one model, its speed, RTT and live session table."""

    peer_id: str
    model: int
    start: int
    end: int
    decode_steps_per_s: float
    prefill_tokens_per_s: float
    rtt_ms: float | None
    table: SessionTable
    died_at: int | None = None
    last_announce: PeerSpan | None = None

    def announce(self) -> PeerSpan:
        """The record this peer publishes now (a dead peer's last record stays as it was)."""
        if self.died_at is None:
            self.last_announce = PeerSpan(
                self.peer_id,
                self.start,
                self.end,
                self.decode_steps_per_s,
                self.prefill_tokens_per_s,
                self.table.free_cache_tokens,
                self.table.sessions_free,
                self.rtt_ms,
            )
        assert self.last_announce is not None
        return self.last_announce


@dataclass
class SimReport:
    """Outcome of a run. Times in ms per decode step as planned; counts of requests.

    A request is *feasible* when, at the moment it is made, live peers with a free session slot
    and enough free KV tokens cover every span of its model (true state, not the snapshot).
    """

    scenario: str
    requests: int = 0
    routed: int = 0
    feasible: int = 0
    feasible_routed: int = 0
    no_route: int = 0
    attempts_exhausted: int = 0
    dead_hop_retries: int = 0
    busy_retries: int = 0
    routes_through_dead_peers: int = 0
    dead_hop_steps: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    hops: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Headline numbers: success rates, mean attempts, hop count and route-time percentiles."""
        times = sorted(self.total_ms)

        def pct(q: float) -> float:
            return times[min(len(times) - 1, int(q * len(times)))] if times else float("nan")

        return {
            "requests": self.requests,
            "routed_rate": self.routed / max(1, self.requests),
            "feasible": self.feasible,
            "feasible_routed_rate": self.feasible_routed / max(1, self.feasible),
            "mean_attempts": sum(self.attempts) / max(1, len(self.attempts)),
            "mean_hops": sum(self.hops) / max(1, len(self.hops)),
            "route_ms_p50": pct(0.5),
            "route_ms_p99": pct(0.99),
            "no_route": self.no_route,
            "attempts_exhausted": self.attempts_exhausted,
            "dead_hop_retries": self.dead_hop_retries,
            "busy_retries": self.busy_retries,
            "routes_through_dead_peers": self.routes_through_dead_peers,
        }


def build_peers(sc: Scenario, rng: random.Random) -> list[SimPeer]:
    """Peers laid out model by model, span by span, `redundancy` per span; speeds and RTTs drawn from rng."""
    if sc.n_layers % sc.span_layers:
        raise ValueError("n_layers must be a multiple of span_layers")
    n_spans = sc.n_layers // sc.span_layers
    cache_tokens = tokens_that_fit(
        sc.kv_budget_bytes, kv_bytes_per_token(sc.span_layers, sc.n_head_kv, sc.head_dim, sc.head_dim)
    )
    peers = []
    for i in range(sc.n_peers):
        model, rest = divmod(i, n_spans * sc.redundancy)
        start = (rest // sc.redundancy) * sc.span_layers
        known = rng.random() >= sc.unknown_rtt_fraction
        peers.append(
            SimPeer(
                peer_id=f"peer{i:05d}",
                model=model,
                start=start,
                end=start + sc.span_layers,
                decode_steps_per_s=rng.uniform(50.0, 400.0),
                prefill_tokens_per_s=rng.uniform(200.0, 2000.0),
                rtt_ms=rng.uniform(2.0, 120.0) if known else None,
                table=SessionTable(sc.sessions_per_peer, cache_tokens, idle_timeout_s=1e9),
            )
        )
    return peers


def _feasible(peers: list[SimPeer], n_spans: int, need_tokens: int) -> bool:
    """True when live peers with a free slot and enough KV (true state, not the snapshot) cover every span."""
    usable = {
        p.start
        for p in peers
        if p.died_at is None and p.table.sessions_free > 0 and p.table.free_cache_tokens >= need_tokens
    }
    return len(usable) == n_spans


def _open_route(
    sc: Scenario,
    model_peers: list[SimPeer],
    snapshot: list[PeerSpan],
    step: int,
    sid: bytes,
    report: SimReport,
) -> list[SimPeer] | None:
    """Plan, then admit hop by hop; on a dead or busy hop exclude it and re-plan. None: gave up."""
    by_id = {p.peer_id: p for p in model_peers}
    exclude: set[str] = set()
    for attempt in range(1, sc.max_attempts + 1):
        try:
            plan = plan_route(snapshot, sc.n_layers, sc.session_tokens, exclude=frozenset(exclude))
        except NoRoute:
            report.no_route += 1
            return None
        opened: list[SimPeer] = []
        for hop in plan.hops:
            peer = by_id[hop.peer_id]
            if peer.died_at is not None:
                report.dead_hop_retries += 1
                report.dead_hop_steps.append(step)
                break
            try:
                peer.table.admit(sid, "client", sc.session_tokens, now_s=float(step))
            except Busy:
                report.busy_retries += 1
                break
            opened.append(peer)
        else:
            report.attempts.append(attempt)
            report.total_ms.append(plan.total_ms)
            report.hops.append(len(plan.hops))
            return opened
        exclude.add(plan.hops[len(opened)].peer_id)
        for peer in opened:
            peer.table.release(sid)
    report.attempts_exhausted += 1
    return None


def run(sc: Scenario) -> SimReport:
    """Simulate `sc.steps` steps and return the report.

    Raises:
        ValueError: n_layers not a multiple of span_layers.
    """
    rng = random.Random(sc.seed)
    peers = build_peers(sc, rng)
    n_spans = sc.n_layers // sc.span_layers
    by_model: dict[int, list[SimPeer]] = {}
    for p in peers:
        by_model.setdefault(p.model, []).append(p)
    models = sorted(by_model)
    report = SimReport(sc.name)
    sessions: list[tuple[int, bytes, list[SimPeer]]] = []  # (end step, session id, hops)
    for step in range(sc.steps):
        if step == sc.kill_step and sc.kill_fraction:
            for p in rng.sample(peers, int(sc.kill_fraction * len(peers))):
                p.died_at = step
        keep = []
        for end_step, sid, hops in sessions:
            if end_step > step:
                keep.append((end_step, sid, hops))
                continue
            for p in hops:
                if p.died_at is None:
                    p.table.release(sid)
        sessions = keep
        snapshots = {
            m: [
                p.announce()
                for p in by_model[m]
                if p.died_at is None or step - p.died_at < sc.record_ttl_steps
            ]
            for m in models
        }
        for r in range(sc.requests_per_step):
            model = rng.choice(models)
            feasible = _feasible(by_model[model], n_spans, sc.session_tokens)
            sid = step.to_bytes(4, "big") + r.to_bytes(4, "big") + bytes(8)
            report.requests += 1
            report.feasible += feasible
            hops = _open_route(sc, by_model[model], snapshots[model], step, sid, report)
            if hops is None:
                continue
            report.routed += 1
            report.feasible_routed += feasible
            report.routes_through_dead_peers += any(p.died_at is not None for p in hops)
            sessions.append((step + sc.session_steps, sid, hops))
    return report
