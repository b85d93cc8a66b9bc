"""Which announced spans can be chained into complete routes, and how much the swarm can route (pure).

A route chains whole spans end to start (see `swarm.route.plan`), so a swarm can serve every layer
and still have no route: [0, 12) and [10, 30) cover 30 layers but never chain. This module looks at
a swarm as a graph whose nodes are layer boundaries 0..n_layers and whose edges are announced
spans [start, end):

- a boundary is *reachable* when a chain of spans leads to it from layer 0, and *finishing* when a
  chain leads from it to n_layers;
- a span lies on a complete chain exactly when its start is reachable and its end is finishing;
  any other span is a *dead end*: no route can use it;
- the swarm's *routable throughput* is the maximum flow from boundary 0 to boundary n_layers when
  each span carries at most its announced decode steps per second: a peer runs one step at a time,
  so this bounds the tokens per second the swarm can generate for all its clients together (a
  max-flow/min-cut bound, Ford and Fulkerson 1956; computed with Edmonds-Karp augmenting paths).

Distinct spans, not peers, are the graph's edges (parallel peers' capacities add), so the graph has
at most n_layers + 1 nodes however many peers announce: a 10,000-peer swarm costs one pass over
its announcements plus a flow over a few hundred edges.

This module does not: read the DHT, weigh RTTs (a flow bound is about compute), or choose spans
(see `swarm.route.placement`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swarm.route.plan import PeerSpan

_EPS = 1e-9
"""Flow below this (steps/s) counts as zero: capacities are floats."""


def usable(p: PeerSpan, n_layers: int) -> bool:
    """A span with integer bounds inside [0, n_layers) and a positive, finite decode speed."""
    return (
        isinstance(p.start, int)
        and isinstance(p.end, int)
        and 0 <= p.start < p.end <= n_layers
        and isinstance(p.decode_steps_per_s, (int, float))
        and 0 < p.decode_steps_per_s < math.inf
    )


class SpanGraph:
    """Layer boundaries as nodes, spans as edges with capacities in decode steps/s.

    A small residual network: `add` merges parallel spans, `max_flow` augments from the current
    flow (so a caller can compute a base flow once, `copy()`, add one candidate span and ask only
    for the extra flow it brings).

    Args:
        n_layers: layers in the model; nodes are 0..n_layers.
    """

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self._res: dict[int, dict[int, float]] = {}  # residual capacity u -> v
        self.flow = 0.0

    def add(self, start: int, end: int, steps_per_s: float) -> None:
        """Add a span's capacity to the edge start → end."""
        fwd = self._res.setdefault(start, {})
        fwd[end] = fwd.get(end, 0.0) + steps_per_s
        self._res.setdefault(end, {}).setdefault(start, 0.0)

    def copy(self) -> "SpanGraph":
        """An independent copy of the residual network and its flow so far."""
        g = SpanGraph(self.n_layers)
        g._res = {u: dict(vs) for u, vs in self._res.items()}
        g.flow = self.flow
        return g

    def max_flow(self, src: int = 0, dst: int | None = None, limit: float = math.inf) -> float:
        """Augment from `src` to `dst` (default: layer 0 to n_layers) until no path has residual
        capacity, or until at least `limit` was added; returns the flow added. Only a full
        0 → n_layers flow counts in `self.flow`."""
        dst = self.n_layers if dst is None else dst
        if src == dst:
            return math.inf
        added = 0.0
        while added < limit:
            parent: dict[int, int] = {src: src}
            queue = deque([src])
            while queue and dst not in parent:
                u = queue.popleft()
                for v, cap in self._res.get(u, {}).items():
                    if cap > _EPS and v not in parent:
                        parent[v] = u
                        queue.append(v)
            if dst not in parent:
                break
            push, v = math.inf, dst
            while v != src:
                u = parent[v]
                push = min(push, self._res[u][v])
                v = u
            v = dst
            while v != src:
                u = parent[v]
                self._res[u][v] -= push
                self._res[v][u] += push
                v = u
            added += push
        if (src, dst) == (0, self.n_layers) and limit == math.inf:
            self.flow += added
        return added

    def gain_bounds(
        self, starts: Iterable[int], ends: Iterable[int], cap: float = math.inf
    ) -> tuple[dict[int, float], dict[int, float]]:
        """What one new span could add to this graph's (already maximum) flow, per boundary.

        Adding an edge s → e of capacity c to a network carrying a maximum flow raises it by exactly
        min(c, F(0 → s), F(e → n_layers)), F being max flows in the residual network. Proof by
        max-flow/min-cut: the new min cut either separates s from e (c plus a residual cut, and
        the residual cut is 0 unless one of the F is 0) or it does not (a residual cut separating 0
        from s, or e from n_layers). So one flow per boundary prices every candidate span instead
        of one flow per candidate.

        Args:
            starts, ends: the boundaries candidate spans may start / end at.
            cap: the largest capacity a candidate has; flows stop once they reach it (the gain
                is capped by c anyway), which keeps each flow to a few augmenting paths.
        Returns:
            (to_start, from_end): min(cap, F(0 → s)) for each start, min(cap, F(e → n_layers)) for
            each end, steps/s (math.inf for s = 0 and e = n_layers). The graph is left unchanged.
        """
        to_start = {s: self.copy().max_flow(0, s, cap) for s in starts}
        from_end = {e: self.copy().max_flow(e, self.n_layers, cap) for e in ends}
        return to_start, from_end


def span_graph(spans: Iterable[PeerSpan], n_layers: int) -> SpanGraph:
    """The residual network of the usable spans, with no flow pushed yet."""
    merged: dict[tuple[int, int], float] = {}
    for p in spans:
        if usable(p, n_layers):
            merged[(p.start, p.end)] = merged.get((p.start, p.end), 0.0) + float(p.decode_steps_per_s)
    g = SpanGraph(n_layers)
    for (s, e), cap in sorted(merged.items()):
        g.add(s, e, cap)
    return g


def routable_throughput(spans: Iterable[PeerSpan], n_layers: int) -> float:
    """Maximum flow from layer 0 to n_layers over the spans, in tokens/s for all clients together.

    Returns 0.0 when no complete chain exists.
    """
    return span_graph(spans, n_layers).max_flow()


def reachable_boundaries(
    bounds: Iterable[tuple[int, int]], n_layers: int
) -> tuple[frozenset[int], frozenset[int]]:
    """(reachable, finishing) boundaries of the spans `bounds` = [(start, end), ...] (see module doc)."""
    by_start: dict[int, set[int]] = {}
    by_end: dict[int, set[int]] = {}
    for s, e in bounds:
        by_start.setdefault(s, set()).add(e)
        by_end.setdefault(e, set()).add(s)
    reach = {0}
    for b in range(n_layers + 1):  # spans only go forward: one pass in boundary order
        if b in reach:
            reach.update(by_start.get(b, ()))
    finish = {n_layers}
    for b in range(n_layers, -1, -1):
        if b in finish:
            finish.update(by_end.get(b, ()))
    return frozenset(reach), frozenset(finish)


@dataclass(frozen=True)
class DeadEnd:
    """An announced span that no complete route can use.

    Attributes:
        peer_id, start, end: the peer and its span.
        reason: "unreachable" (no chain of spans from layer 0 ends at `start`), "no_exit" (no chain
            of spans from `end` reaches the last layer), or "unreachable+no_exit".
    """

    peer_id: str
    start: int
    end: int
    reason: str


@dataclass(frozen=True)
class ChainReport:
    """What a swarm's announced spans can route.

    Attributes:
        n_layers: layers in the model.
        complete: a chain of whole spans joins layer 0 to n_layers.
        reachable, finishing: boundaries reachable from layer 0 / from which the last layer is
            reachable (see module doc).
        routable_tokens_per_s: the swarm's max flow, tokens/s for all clients together.
        dead_ends: spans on no complete chain, in span order.
        missing: layers no usable span covers.
    """

    n_layers: int
    complete: bool
    reachable: frozenset[int]
    finishing: frozenset[int]
    routable_tokens_per_s: float
    dead_ends: tuple[DeadEnd, ...]
    missing: tuple[int, ...]

    def on_complete_chain(self, start: int, end: int) -> bool:
        """Whether a span [start, end) would lie on a complete chain of this swarm's spans."""
        return start in self.reachable and end in self.finishing


def analyze_chains(spans: Sequence[PeerSpan], n_layers: int) -> ChainReport:
    """Chain structure, dead ends and routable throughput of announced spans.

    Args:
        spans: announced spans of one model (unusable ones are ignored: bad bounds or speed).
        n_layers: layers in the model, >= 1.
    Returns:
        ChainReport.
    """
    ok = [p for p in spans if usable(p, n_layers)]
    reach, finish = reachable_boundaries(((p.start, p.end) for p in ok), n_layers)
    dead = []
    for p in sorted(ok, key=lambda p: (p.start, p.end, p.peer_id)):
        why = [
            r for r, bad in (("unreachable", p.start not in reach), ("no_exit", p.end not in finish)) if bad
        ]
        if why:
            dead.append(DeadEnd(p.peer_id, p.start, p.end, "+".join(why)))
    covered = [False] * n_layers
    for p in ok:
        covered[p.start : p.end] = [True] * (p.end - p.start)
    return ChainReport(
        n_layers=n_layers,
        complete=n_layers in reach,
        reachable=reach,
        finishing=finish,
        routable_tokens_per_s=routable_throughput(ok, n_layers),
        dead_ends=tuple(dead),
        missing=tuple(i for i, c in enumerate(covered) if not c),
    )
