"""swarm.route.chains: complete chains, dead ends and the swarm's routable throughput (max flow)."""

import itertools
import random

import pytest

from swarm.route.chains import analyze_chains, routable_throughput, span_graph
from tests.helpers.factories import peer_span


def span(pid, start, end, speed=10.0):
    return peer_span(pid, start, end, decode=speed)


def test_covered_but_unchainable_swarm_names_both_dead_ends():
    # The input: SmolLM2 (30 layers) served as 0:12 and 10:30 covers every layer, no route.
    r = analyze_chains([span("a", 0, 12), span("b", 10, 30)], 30)
    assert r.missing == ()
    assert not r.complete
    assert r.routable_tokens_per_s == 0.0
    assert [(d.peer_id, d.reason) for d in r.dead_ends] == [("a", "no_exit"), ("b", "unreachable")]


def test_complete_chain_with_a_stray_span():
    r = analyze_chains([span("a", 0, 15), span("b", 15, 30), span("c", 0, 12), span("d", 12, 24)], 30)
    assert r.complete
    assert [(d.peer_id, d.reason) for d in r.dead_ends] == [("c", "no_exit"), ("d", "no_exit")]
    assert r.on_complete_chain(0, 15) and not r.on_complete_chain(12, 24)
    assert r.routable_tokens_per_s == pytest.approx(10.0)


def test_flow_is_the_bottleneck_of_series_and_the_sum_of_parallel_spans():
    assert routable_throughput([span("a", 0, 10, 5.0), span("b", 10, 20, 7.0)], 20) == 5.0
    spans = [span("a", 0, 10, 5.0), span("a2", 0, 10, 4.0), span("b", 10, 20, 7.0), span("c", 0, 20, 1.5)]
    assert routable_throughput(spans, 20) == pytest.approx(8.5)  # min(9, 7) + 1.5


def test_flow_uses_crossing_chains():
    # Two chains with different cut points share capacity only through layer boundaries they share.
    spans = [
        span("a", 0, 10, 4.0),
        span("b", 10, 30, 1.0),
        span("c", 0, 20, 1.0),
        span("d", 20, 30, 4.0),
        span("e", 10, 20, 3.0),
    ]
    # paths: a-b (1), c-d (1), a-e-d (3): total 5, limited by a (4) + c (1) out of 0 and b (1) + d (4) into 30
    assert routable_throughput(spans, 30) == pytest.approx(5.0)


def _brute_force_flow(spans, n):
    """Max flow by linear search over integer flows on each span (small cases only)."""
    best = 0
    caps = [int(p.decode_steps_per_s) for p in spans]
    for flows in itertools.product(*(range(c + 1) for c in caps)):
        bal = [0] * (n + 1)
        for p, f in zip(spans, flows):
            bal[p.start] -= f
            bal[p.end] += f
        if all(b == 0 for b in bal[1:n]):
            best = max(best, bal[n])
    return best


@pytest.mark.parametrize("seed", range(25))
def test_flow_equals_brute_force_on_random_small_swarms(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    spans = []
    for i in range(rng.randint(1, 5)):
        s = rng.randrange(n)
        spans.append(span(f"p{i}", s, rng.randint(s + 1, n), float(rng.randint(1, 3))))
    assert routable_throughput(spans, n) == pytest.approx(_brute_force_flow(spans, n))


@pytest.mark.parametrize("seed", range(40))
def test_gain_bounds_price_every_new_span_like_a_fresh_flow(seed):
    """min(c, F(0→s), F(e→n)) in the residual network equals re-running max flow with the span."""
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    spans = []
    for i in range(rng.randint(0, 7)):
        s = rng.randrange(n)
        spans.append(span(f"p{i}", s, rng.randint(s + 1, n), float(rng.randint(1, 4))))
    base = span_graph(spans, n)
    before = base.max_flow()
    to_start, from_end = base.gain_bounds(range(n), range(1, n + 1))
    for s in range(n):
        for e in range(s + 1, n + 1):
            cap = float(rng.randint(1, 4))
            fresh = span_graph([*spans, span("new", s, e, cap)], n).max_flow()
            assert min(cap, to_start[s], from_end[e]) == pytest.approx(fresh - before), (s, e)


def test_bad_spans_are_ignored_not_counted():
    spans = [span("a", 0, 30), span("bad", 5, 99), span("slow", 0, 30, 0.0), span("nan", 0, 30, float("nan"))]
    r = analyze_chains(spans, 30)
    assert r.complete and r.dead_ends == () and r.routable_tokens_per_s == 10.0
