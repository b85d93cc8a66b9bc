"""swarm.route.placement: chain-aware span choice sized by memory, and rebalancing with hysteresis."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.errors import RequestError
from swarm.kv.budget import SpanBudget
from swarm.route.chains import analyze_chains, reachable_boundaries, routable_throughput
from swarm.route.placement import chain_gap, choose_span, rebalance
from swarm.route.plan import PeerSpan
from tests.helpers.factories import peer_span

RATE = 120.0  # layer steps/s of every test peer


def span(pid, start, end, rate=RATE):
    return peer_span(pid, start, end, decode=rate / (end - start))


def budget(n_layers, fits_layers, head_layers=0):
    """Uniform 1 MB layers; memory for `fits_layers` of them (the head costs `head_layers` layers)."""
    mb = 1_000_000
    return SpanBudget(fits_layers * mb, (mb,) * n_layers, head_layers * mb, 0, 0)


def join(peers, n, fits, pid):
    p = choose_span(peers, budget(n, fits), RATE)
    return p, [*peers, span(pid, p.start, p.end)]


def test_issue_input_0_15_then_four_peers_of_12_layers_leaves_no_useless_peer():
    # Today's placement picked 15:27, 27:30, 0:12, 12:24: the last two on no complete chain.
    peers = [span("first", 0, 15)]
    picks = []
    for i in range(4):
        p, peers = join(peers, 30, 12, f"p{i}")
        picks.append((p.start, p.end, p.reason))
    assert picks[:2] == [(15, 27, "extends_chain"), (27, 30, "adds_throughput")]
    r = analyze_chains(peers, 30)
    assert r.complete and r.dead_ends == ()
    # 0:15 is the bottleneck no 12-layer peer can back up; the rest back up the next weakest span
    assert [pk[:2] for pk in picks[2:]] == [(15, 27), (15, 27)]


def test_memory_sizes_the_span_and_the_head_counts_on_the_last_span():
    assert (choose_span([], budget(30, 30)).start, choose_span([], budget(30, 30)).end) == (0, 30)
    p = choose_span([], budget(30, 30, head_layers=2))
    assert (p.start, p.end, p.reason) == (0, 29, "extends_chain")  # the head goes on the last span
    p = choose_span([span("a", 0, 20)], budget(30, 12, head_layers=2))
    assert (p.start, p.end, p.reason) == (20, 30, "adds_throughput")
    p = choose_span([span("a", 0, 20)], budget(30, 11, head_layers=2))
    assert (p.start, p.end, p.reason) == (20, 29, "extends_chain")


def test_a_peer_with_too_little_memory_is_refused_clearly():
    with pytest.raises(RequestError, match="do not hold one layer"):
        choose_span([], budget(30, 0))


def test_equal_bottlenecks_are_backed_up_in_turn():
    peers = [span("a", 0, 12), span("b", 12, 24), span("c", 24, 30)]
    order = []
    for i in range(6):
        p, peers = join(peers, 30, 12, f"p{i}")
        order.append((p.start, p.end))
    # 0:12 and 12:24 share the bottleneck: the first adds nothing alone, the second doubles the flow
    assert order[:2] == [(0, 12), (12, 24)]
    assert routable_throughput(peers, 30) == pytest.approx(3 * RATE / 12)
    assert analyze_chains(peers, 30).dead_ends == ()


def test_a_big_peer_adds_a_whole_route():
    p = choose_span([span("a", 0, 12), span("b", 12, 24), span("c", 24, 30)], budget(30, 30), RATE)
    # a second 0:24 chain through the spare capacity of 24:30 beats a whole 0:30 route (RATE / 30)
    assert (p.start, p.end) == (0, 24) and p.gain_tokens_per_s == pytest.approx(RATE / 24)


def _fitting_chain_candidates(peers, n, b):
    reach, finish = reachable_boundaries(((p.start, p.end) for p in peers), n)
    return [(s, e) for s in reach for e in finish if s < e and b.fits(s, e)]


DEPTHS = [18, 24, 30, 43, 80]  # Gemma3 270M, Qwen 0.5B, SmolLM2, DeepSeek-V4-Flash, a 70B-class model


@settings(max_examples=150, deadline=None)
@given(n=st.sampled_from(DEPTHS), fits=st.lists(st.integers(1, 40), min_size=8, max_size=8))
def test_no_join_order_of_8_peers_creates_an_avoidable_dead_end(n, fits):
    peers: list[PeerSpan] = []
    for i, f in enumerate(fits):
        b = budget(n, f)
        reach, _ = reachable_boundaries(((p.start, p.end) for p in peers), n)
        candidates = _fitting_chain_candidates(peers, n, b)
        dead_before = len(analyze_chains(peers, n).dead_ends)
        p = choose_span(peers, b, RATE)
        assert p.start in reach  # never unreachable from layer 0
        assert b.fits(p.start, p.end)
        peers = [*peers, span(f"p{i}", p.start, p.end)]
        after = analyze_chains(peers, n)
        if candidates:
            assert after.on_complete_chain(p.start, p.end)
            assert len(after.dead_ends) <= dead_before
            # and no candidate would have raised the flow more
            best = max(routable_throughput([*peers[:-1], span("x", s, e)], n) for s, e in candidates)
            assert after.routable_tokens_per_s == pytest.approx(best)
        else:
            assert p.reason == "extends_chain"


@settings(max_examples=100, deadline=None)
@given(n=st.sampled_from(DEPTHS), f=st.integers(1, 40), n_peers=st.integers(4, 8))
def test_equal_peers_have_no_dead_end_once_a_chain_is_complete(n, f, n_peers):
    peers: list[PeerSpan] = []
    complete = False
    for i in range(n_peers):
        _, peers = join(peers, n, f, f"p{i}")
        r = analyze_chains(peers, n)
        complete = complete or r.complete
        if complete:
            assert r.complete and r.dead_ends == ()


def test_rebalance_moves_a_dead_end_onto_the_chain_and_a_good_peer_stays():
    peers = [span("a", 0, 15), span("b", 15, 30), span("me", 0, 12)]
    move = rebalance(peers, peers[-1], budget(30, 15))
    # backing up either half adds no flow alone, but leaves the dead end for a complete chain
    assert (move.start, move.end) == (0, 15) and move.reason == "leaves_dead_end"
    assert move.routable_before == move.routable_after == pytest.approx(RATE / 15)
    stay = rebalance(peers, peers[0], budget(30, 15))
    assert (stay.start, stay.end, stay.reason) == (0, 15, "stays")


def test_rebalance_needs_the_threshold():
    # me on 24:30 gives nothing while 0:12 is the lone bottleneck beside a doubled 12:24
    peers = [span("a", 0, 12), span("b", 12, 24), span("b2", 12, 24), span("c", 24, 30), span("me", 24, 30)]
    move = rebalance(peers, peers[-1], budget(30, 12))
    assert (move.start, move.end) == (0, 12) and move.routable_after == pytest.approx(
        2 * move.routable_before
    )
    assert rebalance(peers, peers[-1], budget(30, 12), min_gain=1.5).reason == "stays"


@pytest.mark.parametrize("n, fits", [(30, [15, 15, 15]), (43, [12, 12, 12, 12]), (43, [20, 8, 8, 8, 8, 8])])
def test_peers_that_crowded_layer_0_spread_until_the_chain_closes(n, fits):
    """Peers that joined together, each seeing an empty swarm, all serve [0, x): no route. One at a
    time, each moves where the gap between what chains reach from layer 0 and what reaches the last
    layer shrinks, until a complete chain exists; then nobody moves."""
    peers = [
        span(f"p{i}", *(lambda p: (p.start, p.end))(choose_span([], budget(n, f), RATE)))
        for i, f in enumerate(fits)
    ]
    assert not analyze_chains(peers, n).complete
    moves = 0
    for _ in range(len(fits)):
        for i, f in enumerate(fits):
            d = rebalance(peers, peers[i], budget(n, f))
            if d.reason != "stays":
                before = chain_gap([(p.start, p.end) for p in peers], n)
                peers[i] = span(peers[i].peer_id, d.start, d.end)
                assert chain_gap([(p.start, p.end) for p in peers], n) < before or d.reason != "extends_chain"
                moves += 1
    assert analyze_chains(peers, n).complete
    assert moves <= 2 * len(fits)
    assert [rebalance(peers, peers[i], budget(n, f)).reason for i, f in enumerate(fits)] == ["stays"] * len(
        fits
    )


def test_a_crowd_short_of_memory_stays_without_moving_forever():
    """Three peers holding 24 of 30 layers cannot close the chain: they stop once the gap is minimal."""
    peers = [span(f"p{i}", 0, 8) for i in range(3)]
    for _ in range(4):
        for i in range(3):
            d = rebalance(peers, peers[i], budget(30, 8))
            peers[i] = span(peers[i].peer_id, d.start, d.end)
    assert chain_gap([(p.start, p.end) for p in peers], 30) == 6
    assert [rebalance(peers, p, budget(30, 8)).reason for p in peers] == ["stays"] * 3


def _settle(n, fits, rounds=10):
    """Peers join one after another, then re-evaluate one at a time; returns (moves per peer, peers)."""
    peers: list[PeerSpan] = []
    for i, f in enumerate(fits):
        _, peers = join(peers, n, f, f"p{i}")
    moves = dict.fromkeys((p.peer_id for p in peers), 0)
    for _ in range(rounds):
        moved = False
        for i, f in enumerate(fits):
            me = peers[i]
            d = rebalance(peers, me, budget(n, f))
            if d.reason != "stays":
                assert d.routable_after >= 1.2 * d.routable_before
                peers[i] = span(me.peer_id, d.start, d.end)
                moves[me.peer_id] += 1
                moved = True
        if not moved:
            return moves, peers
    raise AssertionError(f"still moving after {rounds} rounds: {peers}")


@pytest.mark.parametrize(
    "n, fits",
    [
        (30, [12] * 8),
        (24, [10, 24, 6, 6, 10, 24]),
        (43, [12, 20, 8, 43, 12, 12, 8]),
        (80, [20] * 4),
        (18, [5, 18, 9, 9, 5, 5, 18, 9]),
    ],
)
def test_joining_peers_settle_without_flapping(n, fits):
    moves, peers = _settle(n, fits)
    assert max(moves.values()) <= 2
    r = analyze_chains(peers, n)
    assert r.complete and r.dead_ends == ()
    for i, f in enumerate(fits):  # settled: nobody wants to move any more
        assert rebalance(peers, peers[i], budget(n, f)).reason == "stays"


def test_choose_span_tie_breaks_are_deterministic():
    peers = [span("a", 0, 10), span("b", 10, 20), span("c", 20, 30)]
    picks = {(choose_span(list(order), budget(30, 10)).start) for order in itertools.permutations(peers)}
    assert picks == {0}
