"""Which span a peer should serve, and when a serving peer should move (pure).

A route chains whole spans end to start (`swarm.route.plan`), so a new span helps only if it lies
on a complete chain: it must start at a boundary that a chain from layer 0 reaches and end at a
boundary from which a chain reaches the last layer (or at the last layer itself). Among such
spans that fit the peer's memory (`swarm.kv.budget.SpanBudget`), placement takes the one that
raises the swarm's routable throughput (max flow, `swarm.route.chains`) the most. Ties (often:
a swarm with two equal bottlenecks gains nothing from any single span) go to the span whose
weakest layer has the least throughput on complete chains, then to shorter spans, then to the
lowest start, so successive peers take turns at the bottlenecks.

When no such span fits (the swarm has no complete chain yet, or every gap between usable
boundaries is longer than the peer's memory), the peer extends a chain: it starts at a reachable
boundary and serves as many layers as fit, choosing the start that leaves the shortest gap to a
boundary from which the last layer is reachable, so that the next peers can close the chain. Such
a span is on no complete chain until they do; it is never unreachable from layer 0.

Rebalancing uses the same search with the peer's own span taken out of the swarm: it moves when
the best span gives at least `min_gain` (20%) more routable throughput than staying, when the
peer is a dead end and can move onto a complete chain (backing up a chain helps failover even
when it adds no flow), or, while the swarm has no complete chain, when moving shortens the *chain
gap* (the fewest layers between a boundary a chain from layer 0 reaches and one from which a chain
reaches the last layer): peers that joined together and all took [0, x) spread out until the
chain closes. Each move raises the swarm's max flow by that factor, removes a dead end without
lowering the flow, or shortens an integer gap, over the mover's snapshot, so peers that move one
at a time (random delays, at most once per period, never while holding sessions: the caller's
job) settle after a bounded number of moves instead of flapping.

A candidate's capacity is the peer's layer rate (decode steps/s × layers, from its own
measurement or the swarm's median) divided by the span's length; the output head's extra compute
on the last span is not modelled.

This module does not: read the DHT, measure speeds, or load anything.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swarm.errors import RequestError
from swarm.kv.budget import SpanBudget
from swarm.route.chains import reachable_boundaries, span_graph, usable
from swarm.route.plan import PeerSpan

DEFAULT_LAYER_STEPS_PER_S = 1000.0
"""Layer rate assumed when neither the peer nor the swarm has measured one (layers × steps/s)."""
MIN_GAIN = 0.2
"""A serving peer moves only for at least this relative gain in routable throughput."""
_REL_TIE = 1e-9


@dataclass(frozen=True)
class Placement:
    """A chosen span and why.

    Attributes:
        start, end: the span, global layers, half-open.
        reason: "adds_throughput" (raises the routable throughput), "reinforces_weakest" (on a
            complete chain, no single span raises the flow: backs up its weakest layers),
            "extends_chain" (no span that fits lies on a complete chain: extends one from a
            reachable boundary; rebalancing: the move shortens the chain gap), "stays"
            (rebalancing: the current span is as good), or "leaves_dead_end" (rebalancing: the
            peer is on no complete chain and can move onto one).
        routable_before, routable_after: the swarm's max flow (tokens/s) without and with this
            span (for rebalancing: without the peer, and with it at the chosen span).
        on_complete_chain: the span lies on a complete chain once served.
        candidates: spans that fit and lie on a complete chain, considered.
    """

    start: int
    end: int
    reason: str
    routable_before: float
    routable_after: float
    on_complete_chain: bool
    candidates: int

    @property
    def gain_tokens_per_s(self) -> float:
        """routable_after - routable_before."""
        return self.routable_after - self.routable_before


def swarm_layer_rate(peers: Sequence[PeerSpan], n_layers: int) -> float:
    """Median layer rate (decode steps/s × layers) of usable announced spans; a default when none."""
    rates = [p.decode_steps_per_s * (p.end - p.start) for p in peers if usable(p, n_layers)]
    return statistics.median(rates) if rates else DEFAULT_LAYER_STEPS_PER_S


def choose_span(
    peers: Sequence[PeerSpan],
    budget: SpanBudget,
    layer_steps_per_s: float | None = None,
    allowed: Callable[[int, int], bool] | None = None,
) -> Placement:
    """The span a peer with `budget` should serve given the announced `peers`.

    Args:
        peers: announced spans of the model (any order; unusable ones are ignored).
        budget: what fits the peer's memory; `budget.n_layers` is the model's depth.
        layer_steps_per_s: the peer's decode steps/s × layers; None: the swarm's median.
        allowed: None, or whether llama.cpp can run span (start, end) of this model
            (`swarm.span_rules.span_refusal` is None); spans it refuses are never chosen.
    Returns:
        Placement (see the module docstring for the order of preference).
    Raises:
        RequestError: not even one layer fits the budget anywhere a chain reaches, or a
            non-positive layer rate.
    """
    n = budget.n_layers
    rate = swarm_layer_rate(peers, n) if layer_steps_per_s is None else layer_steps_per_s
    if not rate > 0:
        raise RequestError(f"layer rate must be positive, got {rate}")
    ok = [p for p in peers if usable(p, n)]
    reach, finish = reachable_boundaries(((p.start, p.end) for p in ok), n)
    base = span_graph(ok, n)
    before = base.max_flow()
    weakest = _chain_layer_throughput(ok, reach, finish, n)

    starts = sorted(b for b in reach if b < n)
    to_start, from_end = base.gain_bounds(starts, (f for f in finish if f > 0), cap=rate)
    best_key, best = None, None
    n_candidates = 0
    for s in starts:
        last = budget.longest_end(s)
        for e in sorted(f for f in finish if s < f <= last):
            if allowed is not None and not allowed(s, e):
                continue
            n_candidates += 1
            gain = min(rate / (e - s), to_start[s], from_end[e])
            key = (-round(_bucket(gain, before), 6), round(min(weakest[s:e]), 6), e - s, s)
            if best_key is None or key < best_key:
                best_key, best = key, (s, e, gain)
    if best is not None:
        s, e, gain = best
        reason = "adds_throughput" if _bucket(gain, before) > 0 else "reinforces_weakest"
        return Placement(s, e, reason, before, before + gain, True, n_candidates)

    ext = None
    for s in sorted(b for b in reach if b < n):
        e = budget.longest_end(s)
        while e > s and allowed is not None and not allowed(s, e):
            e -= 1
        if e == s:
            continue
        gap = min(f - e for f in finish if f >= e)
        key = (gap, -e, s)
        if ext is None or key < ext[0]:
            ext = (key, s, e)
    if ext is None:
        raise RequestError(
            f"{budget.memory_bytes} bytes do not hold one layer (with its KV cache) that the model can "
            f"be cut to at any boundary a chain reaches ({sorted(reach)})"
        )
    _, s, e = ext
    return Placement(s, e, "extends_chain", before, before, False, 0)


def rebalance(
    peers: Sequence[PeerSpan],
    me: PeerSpan,
    budget: SpanBudget,
    min_gain: float = MIN_GAIN,
    allowed: Callable[[int, int], bool] | None = None,
) -> Placement:
    """Whether a serving peer should move, and where.

    Args:
        peers: announced spans of the model (this peer's own record may be among them).
        me: this peer's current span and measured speed.
        budget: what fits this peer's memory.
        min_gain: the relative gain in routable throughput a move must bring.
        allowed: as for `choose_span`.
    Returns:
        Placement with reason "stays" and the current span, or the better span (a move). The
        routable figures compare the swarm with this peer at its current span and at the new one.
    """
    n = budget.n_layers
    others = [p for p in peers if p.peer_id != me.peer_id]
    ok = [p for p in others if usable(p, n)]
    rate = me.decode_steps_per_s * (me.end - me.start) if usable(me, n) else swarm_layer_rate(ok, n)
    g = span_graph(ok, n)
    g.add(me.start, me.end, rate / (me.end - me.start))
    staying = g.max_flow()
    reach, finish = reachable_boundaries([*((p.start, p.end) for p in ok), (me.start, me.end)], n)
    stay = Placement(me.start, me.end, "stays", staying, staying, me.start in reach and me.end in finish, 0)
    best = choose_span(ok, budget, rate, allowed)
    gains = best.routable_after > staying * (1 + min_gain)
    leaves_dead_end = best.on_complete_chain and not stay.on_complete_chain
    bounds = [(p.start, p.end) for p in ok]
    closes_gap = n not in reach and chain_gap([*bounds, (best.start, best.end)], n) < chain_gap(
        [*bounds, (me.start, me.end)], n
    )
    if (best.start, best.end) == (me.start, me.end) or not (gains or leaves_dead_end or closes_gap):
        return stay
    return Placement(
        best.start,
        best.end,
        best.reason if gains or closes_gap else "leaves_dead_end",
        staying,
        best.routable_after,
        best.on_complete_chain,
        best.candidates,
    )


def chain_gap(bounds: Sequence[tuple[int, int]], n_layers: int) -> int:
    """The fewest layers no chain covers: min(f - r) over boundaries r reachable from layer 0 and
    f >= r from which the last layer is reachable; 0 when a complete chain exists.

    Args:
        bounds: spans as (start, end) pairs, usable ones only.
        n_layers: layers in the model.
    """
    reach, finish = reachable_boundaries(bounds, n_layers)
    return min(f - r for r in reach for f in finish if f >= r)


def _chain_layer_throughput(ok: Sequence[PeerSpan], reach, finish, n: int) -> list[float]:
    """Decode steps/s of spans on complete chains, summed per layer; `[n_layers]`."""
    delta = [0.0] * (n + 1)  # difference array: one pass over the peers however long their spans
    for p in ok:
        if p.start in reach and p.end in finish:
            delta[p.start] += p.decode_steps_per_s
            delta[p.end] -= p.decode_steps_per_s
    return list(itertools.accumulate(delta[:n]))


def _bucket(gain: float, base: float) -> float:
    """A gain, with float noise relative to the base flow counted as zero."""
    return gain if gain > _REL_TIE * max(1.0, base) else 0.0
