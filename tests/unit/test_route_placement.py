"""choose_span: least-covered window, starting only where a route can reach."""

import pytest

from swarm.route.placement import choose_span, layer_throughput
from swarm.route.plan import PeerSpan


def span(pid, start, end, speed=10.0):
    return PeerSpan(pid, start, end, speed, 100.0, 1000, 4)


def test_empty_swarm_starts_at_zero():
    assert choose_span([], 30, 10) == (0, 10)
    assert choose_span([], 30, 50) == (0, 30)


def test_fills_the_gap_after_an_existing_span():
    assert choose_span([span("a", 0, 10)], 30, 10) == (10, 20)
    assert choose_span([span("a", 0, 10), span("b", 10, 20)], 30, 10) == (20, 30)


def test_prefers_the_weaker_of_two_covered_windows():
    peers = [span("a", 0, 15, speed=5.0), span("b", 15, 30, speed=50.0)]
    assert choose_span(peers, 30, 15) == (0, 15)
    peers = [span("a", 0, 15, speed=50.0), span("b", 15, 30, speed=5.0)]
    assert choose_span(peers, 30, 15) == (15, 30)


def test_never_starts_mid_span():
    # Layers 5..9 are uncovered, but only 0 and 10 are reachable starts besides the end of "b".
    peers = [span("a", 0, 5), span("b", 10, 30)]
    start, end = choose_span(peers, 30, 10)
    assert start in (0, 5) and end == start + 10
    assert start <= 5 and end >= 10  # the uncovered layers 5..9 get served
    assert choose_span(peers, 30, 3) == (5, 8)


def test_throughput_sum_and_bad_args():
    assert layer_throughput([span("a", 0, 2, 3.0), span("b", 1, 3, 4.0)], 3) == [3.0, 7.0, 4.0]
    with pytest.raises(ValueError):
        choose_span([], 0, 1)
