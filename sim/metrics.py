"""What a swarm simulation measured, over virtual time, and the report it prints.

- The layout (spans served now, with peer counts and summed decode steps/s) is judged with the real
  `swarm.route.chains.analyze_chains` at every change, and its figures are integrated over virtual
  time inside the measurement window: the fraction of time a complete chain exists, the fraction
  of served layer-slots (peers × layers) that lie on a complete chain, dead-end peers and the
  routable throughput (max flow).
- Every generation leaves a `GenerationRecord`: completed or why not, exact (equal to the
  fault-free reference tokens), decode tokens/s, time to first token, failovers with stalls.
- Membership counts: joins, departures by kind, moves (and moves made while holding sessions,
  which the drain rule forbids: must stay 0).
- `Stopwatch`: wall time (perf_counter, not virtual) of the real planner calls.

Figures that depend only on the seed (`SwarmReport.outcome`) are kept apart from wall times
(`SwarmReport.wall`), so that a run can be checked for determinism.

This module does not: drive anything; it only records and summarises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from swarm.route.chains import analyze_chains
from swarm.route.plan import PeerSpan

Layout = dict[tuple[int, int], list[float]]
"""Served spans: (start, end) → [peers, summed decode steps/s]."""
COUNTS = (
    "joins",
    "joins_refused",
    "departures_leave",
    "departures_reset",
    "departures_freeze",
    "moves_with_sessions",
)
"""Counters every report shows (zero when nothing happened)."""


@dataclass
class GenerationRecord:
    """One generation's outcome.

    Attributes:
        started_s: virtual time it began.
        completed: every token came back.
        exact: the tokens equal the fault-free reference (meaningful when completed).
        reason: why it failed ("" when completed): the exception's class and message head.
        tokens_per_s: decode tokens/s after the first token (virtual).
        ttft_ms: time to first token, virtual ms (open + prefill).
        stalls: (reason, stall_ms) of each failover.
        retries: hop opens that failed and were retried.
    """

    started_s: float
    completed: bool = False
    exact: bool = False
    reason: str = ""
    tokens_per_s: float = 0.0
    ttft_ms: float = 0.0
    stalls: list[tuple[str, float]] = field(default_factory=list)
    retries: int = 0


class Stopwatch:
    """Wall-clock seconds of calls, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def timed(self, name: str, fn: Callable) -> Callable:
        """`fn`, recording the wall time of each call under `name`."""
        bucket = self.seconds.setdefault(name, [])

        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                bucket.append(time.perf_counter() - t0)

        return call

    @contextlib.contextmanager
    def patched(self, module, name: str) -> Iterator[None]:
        """Time every call of `module.name` (e.g. the planner the route session calls) meanwhile."""
        original = getattr(module, name)
        setattr(module, name, self.timed(name, original))
        try:
            yield
        finally:
            setattr(module, name, original)

    def summary(self) -> dict[str, float]:
        """`<name>_ms_p50`, `_p99`, `_max` and `<name>_calls` for each name."""
        out: dict[str, float] = {}
        for name, s in sorted(self.seconds.items()):
            ms = sorted(1000.0 * x for x in s)
            out[f"{name}_calls"] = len(ms)
            out[f"{name}_ms_p50"] = _pct(ms, 0.5)
            out[f"{name}_ms_p99"] = _pct(ms, 0.99)
            out[f"{name}_ms_max"] = _pct(ms, 1.0)
        return out


def _pct(sorted_values: list[float], q: float, digits: int = 2) -> float | None:
    """The q-quantile (nearest rank below) of sorted values, rounded; None when empty."""
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], digits)


@dataclass(frozen=True)
class LayoutFigures:
    """How good a layout is.

    Attributes:
        complete: a chain of served spans joins layer 0 to the last layer.
        on_chain: fraction of served layer-slots (peers × layers) on spans of a complete chain.
        dead_end_peers: peers whose span no complete route can use.
        routable_tokens_per_s: the layout's max flow (`swarm.route.chains`).
        serving: peers serving; spans: distinct spans served.
    """

    complete: bool
    on_chain: float
    dead_end_peers: int
    routable_tokens_per_s: float
    serving: int
    spans: int


def judge(layout: Layout, n_layers: int) -> LayoutFigures:
    """The figures of a layout, from the real `analyze_chains` over its distinct spans."""
    spans = [PeerSpan(f"{s}:{e}", s, e, cap, cap, 1, 1) for (s, e), (n, cap) in layout.items() if n > 0]
    rep = analyze_chains(spans, n_layers)
    dead = {(d.start, d.end) for d in rep.dead_ends}
    slots = sum(n * (e - s) for (s, e), (n, _) in layout.items())
    on_chain = sum(n * (e - s) for (s, e), (n, _) in layout.items() if (s, e) not in dead)
    return LayoutFigures(
        complete=rep.complete,
        on_chain=on_chain / slots if slots else 0.0,
        dead_end_peers=int(sum(layout[k][0] for k in dead)),
        routable_tokens_per_s=rep.routable_tokens_per_s,
        serving=int(sum(n for n, _ in layout.values())),
        spans=len(spans),
    )


@dataclass
class _Integral:
    """Time integrals of the layout's figures over the window, virtual seconds × value."""

    seconds: float = 0.0
    complete: float = 0.0
    on_chain: float = 0.0
    dead_end_peers: float = 0.0
    routable: float = 0.0
    serving: float = 0.0
    spans: float = 0.0


class Metrics:
    """Records a run (see the module docstring).

    Args:
        n_layers: layers in the model.
    """

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self.stopwatch = Stopwatch()
        self.counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self.generations: list[GenerationRecord] = []
        self.moves: list[tuple[float, str, tuple[int, int], tuple[int, int]]] = []
        self.dead_end_peers_max = 0
        self.routable_min = float("inf")
        self._window: tuple[float, float] | None = None
        self._state: tuple[float, ...] = (0.0,) * 6
        self._last_s = 0.0
        self._acc = _Integral()

    def count(self, what: str, n: int = 1) -> None:
        """Add to a named counter (joins, departures by kind, refused joins, ...)."""
        self.counts[what] = self.counts.get(what, 0) + n

    def moved(
        self, now_s: float, peer_id: str, old: tuple[int, int], new: tuple[int, int], sessions: int
    ) -> None:
        """A peer moved its span; `sessions` it still held (the drain rule wants 0)."""
        self.moves.append((now_s, peer_id, old, new))
        self.count("moves_with_sessions", int(sessions > 0))

    def window(self, start_s: float, end_s: float) -> None:
        """Integrate the layout over [start_s, end_s) only (call before start_s)."""
        self._window = (start_s, end_s)

    def layout_changed(self, now_s: float, layout: Layout) -> None:
        """The served spans changed at `now_s`: close the previous interval, judge the new layout."""
        self._advance(now_s)
        f = judge(layout, self.n_layers)
        self._state = (
            float(f.complete),
            f.on_chain,
            float(f.dead_end_peers),
            f.routable_tokens_per_s,
            float(f.serving),
            float(f.spans),
        )
        if self._in_window(now_s):
            self.dead_end_peers_max = max(self.dead_end_peers_max, f.dead_end_peers)
            self.routable_min = min(self.routable_min, f.routable_tokens_per_s)

    def finish(self, now_s: float) -> None:
        """Close the last interval (call once, at the end of the run)."""
        self._advance(now_s)

    def _in_window(self, t: float) -> bool:
        return self._window is not None and self._window[0] <= t < self._window[1]

    def _advance(self, now_s: float) -> None:
        if self._window is not None:
            lo, hi = max(self._last_s, self._window[0]), min(now_s, self._window[1])
            if hi > lo:
                if not self._in_window(self._last_s):  # the state entering the window counts too
                    self.dead_end_peers_max = max(self.dead_end_peers_max, int(self._state[2]))
                    self.routable_min = min(self.routable_min, self._state[3])
                dt, a, st = hi - lo, self._acc, self._state
                a.seconds += dt
                a.complete += dt * st[0]
                a.on_chain += dt * st[1]
                a.dead_end_peers += dt * st[2]
                a.routable += dt * st[3]
                a.serving += dt * st[4]
                a.spans += dt * st[5]
        self._last_s = now_s

    def report(self, scenario: str) -> "SwarmReport":
        """The summary of everything recorded."""
        return SwarmReport(scenario, self)


class SwarmReport:
    """Headline figures of a run: `outcome()` (a function of the seed) and `wall()` (timings)."""

    def __init__(self, scenario: str, m: Metrics):
        self.scenario, self._m = scenario, m
        self.wall_s = 0.0

    def outcome(self) -> dict:
        """Every figure that depends only on the scenario and its seed (virtual time)."""
        m, a = self._m, self._m._acc
        per_s = (lambda x: round(x / a.seconds, 6)) if a.seconds else (lambda x: None)
        gens = m.generations
        done = [g for g in gens if g.completed]
        tps = sorted(g.tokens_per_s for g in done)
        stalls = sorted(ms for g in gens for _, ms in g.stalls)
        reasons: dict[str, int] = {}
        for g in gens:
            for why, _ in g.stalls:
                reasons[why] = reasons.get(why, 0) + 1
        failed: dict[str, int] = {}
        for g in gens:
            if not g.completed:
                failed[g.reason] = failed.get(g.reason, 0) + 1
        return {
            "scenario": self.scenario,
            "n_layers": m.n_layers,
            "window_s": round(a.seconds, 3),
            "peers_serving_mean": per_s(a.serving),
            "distinct_spans_mean": per_s(a.spans),
            "complete_chain_time": per_s(a.complete),
            "layers_on_chain": per_s(a.on_chain),
            "dead_end_peers_mean": per_s(a.dead_end_peers),
            "dead_end_peers_max": m.dead_end_peers_max,
            "routable_tokens_per_s_mean": per_s(a.routable),
            "routable_tokens_per_s_min": round(m.routable_min, 3) if a.seconds else None,
            **dict(sorted(m.counts.items())),
            "moves": len(m.moves),
            "generations": len(gens),
            "completed": len(done),
            "completed_fraction": round(len(done) / len(gens), 6) if gens else None,
            "exact": sum(g.exact for g in done),
            "failed": dict(sorted(failed.items())),
            "tokens_per_s_p50": _pct(tps, 0.5, 3),
            "tokens_per_s_p10": _pct(tps, 0.1, 3),
            "ttft_ms_p50": _pct(sorted(g.ttft_ms for g in done), 0.5, 1),
            "failovers": len(stalls),
            "failover_reasons": dict(sorted(reasons.items())),
            "stall_ms_p50": _pct(stalls, 0.5, 1),
            "stall_ms_p99": _pct(stalls, 0.99, 1),
            "stall_ms_max": _pct(stalls, 1.0, 1),
            "retries": sum(g.retries for g in gens),
        }

    def wall(self) -> dict:
        """Wall-clock figures: the planner's time per call, and the whole run's."""
        return {**self._m.stopwatch.summary(), "wall_s": round(self.wall_s, 1)}

    def summary(self) -> dict:
        """outcome() and wall() together, for printing."""
        return {**self.outcome(), **self.wall()}
