"""Route planning: the cheapest chain of announced spans covering a model's layers.

A route is a chain of hops, each hop one peer running its *whole* announced span [start, end).
Decision: a hop never enters or leaves a peer's span in the middle. Petals lets a client use part
of a server's blocks, but our span executor loads exactly [start, end) (a sliced GGUF) and runs
every layer of it; it can neither start at a later layer nor stop early. So hops chain only where
one span's end equals the next span's start, and a peer serving [0, 20) is useless to a route whose
next hop starts at 10. Peers that want to be chained therefore align their spans (placement).

Cost of a hop, in ms per decode step: network_ms (the client's round trip to the peer: its measured
rtt, or `default_rtt_ms` when unknown) + compute_ms (1000 / decode_steps_per_s, the peer's announced
speed for one token through its span, plus prefill_tokens × 1000 / prefill_tokens_per_s when the
caller weighs a prefill), plus a penalty for a peer spot checks caught computing wrong
(swarm/route/verify.py). The route minimizes the sum; ties go to fewer hops, then to the
lexicographically smallest sequence of peer ids (deterministic). The search is a shortest path over
layer boundaries 0..n_layers; spans only go forward, so the graph is a DAG and one pass in boundary
order is Dijkstra's result in O(peers + n_layers).

Skipped peers: excluded ids (failover), spans outside [0, n_layers) or with non-positive speeds
(bad announcement), no free session slot, or fewer free KV tokens than the session needs.

This module does not: read the DHT, measure RTTs, open streams, or read a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarm.errors import NoRoute, RequestError, SessionTooLong
from swarm.reach_rules import unreachable_words

DEFAULT_RTT_MS = 50.0
"""Round trip assumed for a peer whose RTT has not been measured yet."""


@dataclass(frozen=True)
class PeerSpan:
    """One peer's announced span, as the planner sees it.

    Attributes:
        peer_id: the peer's id.
        start, end: global layers served, half-open.
        decode_steps_per_s: one-token steps per second through the whole span.
        prefill_tokens_per_s: prompt tokens per second through the whole span.
        free_cache_tokens: KV tokens a new session can reserve at the peer now (at most its
            per-session cap, cache tokens / sessions).
        sessions_free: session slots the peer can still open.
        rtt_ms: measured client ↔ peer round trip, ms; None when unknown.
        incarnation: when this run of the peer started serving (its announcement's `started_at`,
            Unix seconds; 0 when not announced): a new value means the peer restarted.
        reachability: what the peer announces of its reachability ("public", "private", "unknown"):
            the likely cause when it does not answer.
    """

    peer_id: str
    start: int
    end: int
    decode_steps_per_s: float
    prefill_tokens_per_s: float
    free_cache_tokens: int
    sessions_free: int
    rtt_ms: float | None = None
    incarnation: float = 0.0
    reachability: str = "unknown"


@dataclass(frozen=True)
class Hop:
    """One step of a route: `peer_id` runs global layers [start, end).

    Attributes:
        compute_ms: expected compute per step (see module docstring).
        network_ms: client ↔ peer round trip used for planning.
        reason: why this hop: "only_candidate" (the one usable span from `start` on the chosen
            path's boundary) or "lowest_cost"; with "+default_rtt" when the RTT was unknown.
    """

    peer_id: str
    start: int
    end: int
    compute_ms: float
    network_ms: float
    reason: str


@dataclass(frozen=True)
class RoutePlan:
    """Hops in layer order covering [start, end) with their summed cost.

    Attributes:
        hops: chained hops, hops[i].end == hops[i + 1].start.
        total_ms: sum of compute_ms + network_ms over the hops.
        skipped: (peer_id, reason) for every announced span the planner could not use; reasons:
            "unreachable" (announced, but did not answer: rtt_ms is inf, or in `unreachable`),
            "excluded", "bad_span", "no_session_slot", "cache_full".
    """

    hops: tuple[Hop, ...]
    total_ms: float
    skipped: tuple[tuple[str, str], ...] = ()


def _skip_reason(p: PeerSpan, n_layers: int, need_tokens: int, exclude: frozenset[str],
                 unreachable: frozenset[str]) -> str | None:
    if p.peer_id in unreachable or p.rtt_ms == math.inf:
        return "unreachable"
    if p.peer_id in exclude:
        return "excluded"
    speeds_ok = all(
        isinstance(v, (int, float)) and 0 < v < math.inf
        for v in (p.decode_steps_per_s, p.prefill_tokens_per_s)
    )
    ints_ok = all(isinstance(v, int) for v in (p.start, p.end, p.free_cache_tokens, p.sessions_free))
    if not (ints_ok and speeds_ok and 0 <= p.start < p.end <= n_layers):
        return "bad_span"
    if p.sessions_free < 1:
        return "no_session_slot"
    if p.free_cache_tokens < need_tokens:
        return "cache_full"
    return None


def layer_ranges(layers) -> str:
    """Ascending layers as half-open spans, written as everywhere else: [1, 2, 3, 7] → "1:4, 7:8"."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(f"{a}:{b + 1}" for a, b in runs)


def route_room(peers: Sequence[PeerSpan], n_layers: int, *, exclude: frozenset[str] = frozenset()) -> int:
    """The longest session some complete route could hold now: the largest `need_tokens` for which
    `plan_route` finds a route, i.e. over every chain of usable spans from layer 0 to n_layers, the
    most of its smallest `free_cache_tokens` (a widest-path pass over layer boundaries, in boundary
    order like `plan_route`'s).

    Args:
        peers: snapshot of announced spans (any order).
        n_layers: layers in the model.
        exclude: peer ids not to use.
    Returns:
        KV tokens (prompt + generation) one new session may reserve on every hop; 0 when no chain of
        usable peers (free slot, not excluded, a sound span) reaches the last layer.
    """
    widest: dict[int, int] = {0: 2**62}  # boundary -> the most tokens a chain from layer 0 to it holds
    by_start: dict[int, list[PeerSpan]] = {}
    for p in peers:
        if _skip_reason(p, n_layers, 0, exclude, frozenset()) is None:
            by_start.setdefault(p.start, []).append(p)
    for b in range(n_layers):
        if b not in widest:
            continue
        for p in by_start.get(b, ()):
            widest[p.end] = max(widest.get(p.end, 0), min(widest[b], p.free_cache_tokens))
    return widest.get(n_layers, 0)


def plan_route(
    peers: Sequence[PeerSpan],
    n_layers: int,
    need_tokens: int,
    *,
    start: int = 0,
    end: int | None = None,
    exclude: frozenset[str] = frozenset(),
    default_rtt_ms: float = DEFAULT_RTT_MS,
    prefill_tokens: int = 0,
    penalty_ms: Mapping[str, float] | None = None,
    unreachable: frozenset[str] = frozenset(),
) -> RoutePlan:
    """Pick whole spans chaining layer `start` to `end` with the least expected time per step.

    Args:
        peers: snapshot of announced spans (any order; one entry per peer and span).
        n_layers: layers in the model.
        need_tokens: KV tokens the session will reserve on every hop (prompt + generation).
        start, end: global layer boundaries to connect, half-open; end defaults to n_layers. A
            failover re-plans from the failed hop's start.
        exclude: peer ids not to use (e.g. peers that just failed).
        default_rtt_ms: network cost of a peer with unknown RTT.
        prefill_tokens: prompt tokens to weigh into compute cost (0: decode step only).
        penalty_ms: peer id → extra cost in ms per step (offences found by spot checks,
            swarm/route/verify.py `Standing.penalties`); a penalised peer is used only when no
            cheaper chain exists.
        unreachable: peer ids that did not answer a dial or probe (skipped as "unreachable", which
            NoRoute tells apart from layers nobody announces).
    Returns:
        RoutePlan: hops in layer order; total_ms their summed cost; skipped peers with reasons.
    Raises:
        RequestError: bad arguments (layer range, negative tokens or RTT).
        NoRoute: some layer in [start, end) has no usable span (`.missing` lists them), or all are
            covered but no chain of whole spans joins start to end (`.missing` empty); no peers at all.
            When unreachable peers announce every missing layer, the message says so, with the
            likely cause and the fix (reach_rules.unreachable_words).
        SessionTooLong: (a NoRoute) every peer serving a missing layer is usable but for offering a
            session fewer than need_tokens KV tokens.
    """
    end = n_layers if end is None else end
    penalties = penalty_ms or {}
    if not 0 <= start < end <= n_layers:
        raise RequestError(f"layer range [{start}, {end}) is not inside a {n_layers}-layer model")
    if need_tokens < 0 or prefill_tokens < 0 or not 0 <= default_rtt_ms < math.inf:
        raise RequestError("need_tokens, prefill_tokens and default_rtt_ms must be >= 0")
    if not peers:
        raise NoRoute("no peer announces this model: nobody serves it on this swarm (is it the model the "
                      "peers serve, and are the initial peers in its swarm?)",
                      missing=tuple(range(start, end)))
    skipped: list[tuple[str, str]] = []
    most_free = 0  # the most KV tokens a peer skipped for cache_full offers a new session
    too_small: list[PeerSpan] = []  # skipped only because the session is longer than they offer
    other_skipped: list[PeerSpan] = []  # skipped for a reason that may pass (excluded, no free slot)
    silent: list[PeerSpan] = []  # announced but not answering
    by_start: dict[int, list[PeerSpan]] = {}
    for p in peers:
        reason = _skip_reason(p, n_layers, need_tokens, exclude, unreachable)
        if reason is not None:
            skipped.append((p.peer_id, reason))
            if reason == "unreachable":
                silent.append(p)
            elif reason == "cache_full":
                most_free = max(most_free, p.free_cache_tokens)
                too_small.append(p)
            elif reason != "bad_span":
                other_skipped.append(p)
        elif start <= p.start and p.end <= end:
            by_start.setdefault(p.start, []).append(p)

    # best[b] = (cost_ms, n_hops, peer ids, hops) of the cheapest chain from `start` to boundary b
    best: dict[int, tuple[float, int, tuple[str, ...], tuple[Hop, ...]]] = {start: (0.0, 0, (), ())}
    for b in range(start, end):
        if b not in best or b not in by_start:
            continue
        cost, n_hops, ids, hops = best[b]
        candidates = by_start[b]
        for p in candidates:
            known = p.rtt_ms is not None and 0 <= p.rtt_ms < math.inf
            network = float(p.rtt_ms) if known else float(default_rtt_ms)
            compute = 1000.0 / p.decode_steps_per_s + 1000.0 * prefill_tokens / p.prefill_tokens_per_s
            compute += penalties.get(p.peer_id, 0.0)
            reason = "only_candidate" if len(candidates) == 1 else "lowest_cost"
            reason += "" if known else "+default_rtt"
            key = (cost + network + compute, n_hops + 1, ids + (p.peer_id,))
            if p.end not in best or key < best[p.end][:3]:
                hop = Hop(p.peer_id, p.start, p.end, compute, network, reason)
                best[p.end] = (*key, hops + (hop,))
    if end in best:
        total, _, _, hops = best[end]
        return RoutePlan(hops=hops, total_ms=total, skipped=tuple(skipped))

    covered = {layer for ps in by_start.values() for p in ps for layer in range(p.start, p.end)}
    missing = [layer for layer in range(start, end) if layer not in covered]
    counts = {
        r: sum(1 for _, why in skipped if why == r)
        for r in ("unreachable", "excluded", "no_session_slot", "cache_full")
    }
    why = (
        f"(skipped: {counts['unreachable']} announced but unreachable, {counts['excluded']} excluded, "
        f"{counts['no_session_slot']} without a session slot, "
        f"{counts['cache_full']} without {need_tokens} free KV tokens"
        + (f": the most any of them offers a new session is {most_free}" if counts["cache_full"] else "")
        + ")"
    )
    if missing and all(
        any(p.start <= layer < p.end for p in too_small)
        and not any(p.start <= layer < p.end for p in other_skipped)
        for layer in missing
    ):
        most = max(p.free_cache_tokens for p in too_small if any(p.start <= m < p.end for m in missing))
        raise SessionTooLong(
            f"this session needs {need_tokens} KV tokens (prompt + tokens to generate), but the peers "
            f"serving layers {layer_ranges(missing)} take at most {most} per session: shorten the "
            "prompt or ask for fewer new tokens",
            tuple(missing), need_tokens, most,
        )
    if missing and all(any(p.start <= layer < p.end for p in silent) for layer in missing):
        serving = [p for p in silent if any(p.start <= m < p.end for m in missing)]
        raise NoRoute(
            f"layers {layer_ranges(missing)} are announced, but by no peer that answers: "
            f"{len(serving)} peer(s) serving them did not answer a dial: "
            f"{unreachable_words([p.reachability for p in serving])}",
            missing=tuple(missing),
        )
    if missing:
        silent_layers = [m for m in missing if any(p.start <= m < p.end for p in silent)]
        also = "" if not silent_layers else (
            f"; of these, layers {layer_ranges(silent_layers)} are announced only by peers that did not "
            f"answer: {unreachable_words([p.reachability for p in silent])}"
        )
        raise NoRoute(f"no usable peer serves layers {layer_ranges(missing)} {why}{also}", missing=tuple(missing))
    raise NoRoute(
        f"every layer in [{start}, {end}) is served, but no chain of whole spans joins them: "
        f"span boundaries do not line up {why}"
    )
