"""Which span a new peer should serve: the part of the model the swarm covers least (pure).

Like Petals' block selection, a peer without `--layers` picks the window of layers whose announced
throughput is lowest. Unlike Petals, a route in swarm uses whole spans chained end to start (see
`swarm.route.plan`), so a window may only start at a boundary that a route can reach: layer 0 or
the end of an announced span. That keeps every new span usable in some chain.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm.route.plan import PeerSpan


def layer_throughput(peers: Sequence[PeerSpan], n_layers: int) -> list[float]:
    """Decode steps/s summed over the peers that serve each layer; `[n_layers]`."""
    cover = [0.0] * n_layers
    for p in peers:
        for layer in range(max(0, p.start), min(n_layers, p.end)):
            cover[layer] += max(0.0, p.decode_steps_per_s)
    return cover


def choose_span(peers: Sequence[PeerSpan], n_layers: int, n_wanted: int) -> tuple[int, int]:
    """Pick [start, end) of `n_wanted` layers (fewer at the model's end) that the swarm covers least.

    Args:
        peers: announced spans of the model (may be empty).
        n_layers: layers in the model.
        n_wanted: layers this peer can hold, >= 1 (from its memory budget).
    Returns:
        (start, end), global, half-open. Among windows starting at reachable boundaries, the one
        whose per-layer throughputs, sorted ascending, are lexicographically smallest; ties go to
        the lowest start.
    Raises:
        ValueError: n_layers < 1 or n_wanted < 1.
    """
    if n_layers < 1 or n_wanted < 1:
        raise ValueError(f"need n_layers >= 1 and n_wanted >= 1, got {n_layers}, {n_wanted}")
    cover = layer_throughput(peers, n_layers)
    starts = sorted({0} | {p.end for p in peers if 0 < p.end < n_layers})
    best: tuple[tuple[float, ...], int] | None = None
    for start in starts:
        end = min(n_layers, start + n_wanted)
        key = (tuple(sorted(cover[start:end])), start)
        if best is None or key < best:
            best = key
    assert best is not None
    start = best[1]
    return start, min(n_layers, start + n_wanted)
