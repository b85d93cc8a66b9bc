"""swarm.route.plan: cost, capacity skips, ties, RTT defaults, misalignment, missing layers, exclusion."""

import pytest

from swarm.errors import NoRoute, RequestError, SessionTooLong
from swarm.route.plan import DEFAULT_RTT_MS, layer_ranges, plan_route, route_room
from tests.helpers.factories import peer_span


def span(pid, start, end, steps=100.0, rtt=10.0, cache=10_000, slots=4, prefill=1000.0):
    return peer_span(pid, start, end, decode=steps, prefill=prefill, cache=cache, slots=slots, rtt_ms=rtt)


def chain(plan):
    return [(h.peer_id, h.start, h.end) for h in plan.hops]


def test_cheapest_chain_and_costs():
    peers = [
        span("a", 0, 10, steps=100),
        span("a2", 0, 10, steps=50),
        span("b", 10, 30, steps=200, rtt=4.0),
        span("c", 10, 20),
        span("d", 20, 30),
    ]
    plan = plan_route(peers, 30, need_tokens=512)
    assert chain(plan) == [("a", 0, 10), ("b", 10, 30)]
    assert [(h.compute_ms, h.network_ms) for h in plan.hops] == [(10.0, 10.0), (5.0, 4.0)]
    assert plan.total_ms == 29.0
    assert [h.reason for h in plan.hops] == ["lowest_cost", "lowest_cost"]
    assert plan.skipped == ()


def test_three_hops_win_when_cheaper():
    peers = [span("a", 0, 10), span("b", 10, 30, steps=10), span("c", 10, 20), span("d", 20, 30)]
    plan = plan_route(peers, 30, 1)
    assert chain(plan) == [("a", 0, 10), ("c", 10, 20), ("d", 20, 30)]
    assert plan.total_ms == pytest.approx(60.0)


def test_equal_cost_prefers_fewer_hops():
    # a+b: (10+10) + (10+10) = 40 ms; whole: 20 + 20 = 40 ms (steps 50 -> 20 ms, rtt 20)
    peers = [span("a", 0, 15), span("b", 15, 30), span("whole", 0, 30, steps=50, rtt=20.0)]
    plan = plan_route(peers, 30, 1)
    assert chain(plan) == [("whole", 0, 30)]
    assert plan.hops[0].reason == "lowest_cost"


def test_equal_cost_equal_hops_is_deterministic_by_peer_id():
    peers = [span("z", 0, 30), span("m", 0, 30)]
    assert chain(plan_route(peers, 30, 1)) == [("m", 0, 30)]
    assert chain(plan_route(list(reversed(peers)), 30, 1)) == [("m", 0, 30)]


def test_capacity_skips():
    peers = [
        span("full_slots", 0, 10, steps=1000, slots=0),
        span("full_cache", 0, 10, steps=1000, cache=99),
        span("ok", 0, 10),
        span("tail", 10, 20),
    ]
    plan = plan_route(peers, 20, need_tokens=100)
    assert chain(plan) == [("ok", 0, 10), ("tail", 10, 20)]
    assert set(plan.skipped) == {("full_slots", "no_session_slot"), ("full_cache", "cache_full")}
    assert plan.hops[1].reason == "only_candidate"


def test_no_route_for_a_session_longer_than_every_peer_offers_names_the_cap():
    # peers announce what a NEW session can reserve (their per-session cap), so a longer session
    # finds no route, and the message says how long a session may be and what to do
    peers = [span("a", 0, 10, cache=2048), span("b", 0, 10, cache=1024), span("t", 10, 20, cache=2048)]
    with pytest.raises(SessionTooLong, match="needs 3000 KV tokens .* layers 0:20 take at most 2048 per "
                                             "session: shorten the prompt") as e:
        plan_route(peers, 20, need_tokens=3000)
    assert (e.value.need_tokens, e.value.most_tokens, e.value.missing) == (3000, 2048, tuple(range(20)))
    assert chain(plan_route(peers, 20, need_tokens=2048)) == [("a", 0, 10), ("t", 10, 20)]


def test_route_room_is_the_widest_chain_and_plan_route_agrees():
    # chains: b(3000)+t(4096) holds 3000, a(2048)+t 2048, b+u(1024) 1024, whole(1500) 1500
    peers = [span("a", 0, 10, cache=2048), span("b", 0, 10, cache=3000), span("t", 10, 20, cache=4096),
             span("u", 10, 20, cache=1024), span("whole", 0, 20, cache=1500),
             span("busy", 0, 20, cache=9000, slots=0)]
    assert route_room(peers, 20) == 3000
    assert chain(plan_route(peers, 20, need_tokens=3000)) == [("b", 0, 10), ("t", 10, 20)]
    with pytest.raises(NoRoute, match="the most any of them offers a new session is 3000"):
        plan_route(peers, 20, need_tokens=3001)
    assert route_room(peers, 20, exclude=frozenset({"b"})) == 2048
    assert route_room(peers, 20, exclude=frozenset({"a", "b"})) == 1500
    assert route_room(peers, 20, exclude=frozenset({"t"})) == 1500  # b+u holds only 1024
    assert route_room(peers, 20, exclude=frozenset({"t", "whole"})) == 1024
    assert route_room(peers[:2], 20) == 0  # nothing reaches layer 20
    assert route_room([], 20) == 0


def test_a_long_session_blocked_also_by_a_busy_or_excluded_peer_may_pass_later():
    # the peer without a free slot may offer more once one frees: a plain NoRoute, worth a retry
    peers = [span("small", 0, 10, cache=1024), span("busy", 0, 10, slots=0), span("t", 10, 20, cache=4096)]
    with pytest.raises(NoRoute, match="1 without a session slot, 1 without 3000 free KV tokens") as e:
        plan_route(peers, 20, need_tokens=3000)
    assert not isinstance(e.value, SessionTooLong) and e.value.missing == tuple(range(10))
    with pytest.raises(NoRoute, match="1 excluded") as e:
        plan_route(peers[:1] + peers[2:] + [span("x", 0, 10)], 20, need_tokens=3000, exclude=frozenset({"x"}))
    assert not isinstance(e.value, SessionTooLong)


def test_no_peers_at_all_says_nobody_serves_the_model():
    with pytest.raises(NoRoute, match="no peer announces this model") as e:
        plan_route([], 24, need_tokens=10)
    assert not isinstance(e.value, SessionTooLong) and e.value.missing == tuple(range(24))


def test_layer_ranges_are_half_open_spans():
    assert layer_ranges([1, 2, 3, 7, 9, 10]) == "1:4, 7:8, 9:11"


def test_unknown_rtt_uses_default_and_is_flagged():
    peers = [span("a", 0, 10, rtt=None), span("b", 0, 10, rtt=60.0)]
    plan = plan_route(peers, 10, 1)
    assert chain(plan) == [("a", 0, 10)]
    assert plan.hops[0].network_ms == DEFAULT_RTT_MS
    assert plan.hops[0].reason == "lowest_cost+default_rtt"
    plan = plan_route(peers, 10, 1, default_rtt_ms=100.0)
    assert chain(plan) == [("b", 0, 10)]


def test_prefill_weight_changes_the_choice():
    fast_decode = span("fd", 0, 10, steps=200, prefill=100.0)
    fast_prefill = span("fp", 0, 10, steps=100, prefill=10_000.0)
    assert chain(plan_route([fast_decode, fast_prefill], 10, 1)) == [("fd", 0, 10)]
    plan = plan_route([fast_decode, fast_prefill], 10, 1, prefill_tokens=100)
    assert chain(plan) == [("fp", 0, 10)]
    assert plan.hops[0].compute_ms == pytest.approx(10.0 + 10.0)


def test_missing_layers_are_listed():
    peers = [span("a", 0, 10), span("c", 20, 25), span("full", 10, 20, slots=0)]
    with pytest.raises(NoRoute, match=r"layers 10:20, 25:30 .*1 without a session slot") as err:
        plan_route(peers, 30, 1)
    assert err.value.missing == tuple(range(10, 20)) + tuple(range(25, 30))


def test_misaligned_spans_cover_but_do_not_chain():
    peers = [span("a", 0, 20), span("b", 10, 30)]
    with pytest.raises(NoRoute, match="do not line up") as err:
        plan_route(peers, 30, 1)
    assert err.value.missing == ()


def test_exclusion_for_failover():
    peers = [span("a", 0, 10), span("b", 10, 20), span("b2", 10, 20, steps=50)]
    plan = plan_route(peers, 20, 1, exclude=frozenset({"b"}))
    assert chain(plan) == [("a", 0, 10), ("b2", 10, 20)]
    assert ("b", "excluded") in plan.skipped
    with pytest.raises(NoRoute, match="2 excluded") as err:
        plan_route(peers, 20, 1, exclude=frozenset({"b", "b2"}))
    assert err.value.missing == tuple(range(10, 20))


def test_partial_range_replans_from_a_boundary():
    peers = [span("a", 0, 10), span("b", 10, 20), span("c", 20, 30), span("bc", 10, 30, steps=10)]
    plan = plan_route(peers, 30, 1, start=10, exclude=frozenset({"b"}))
    assert chain(plan) == [("bc", 10, 30)]
    assert chain(plan_route(peers, 30, 1, start=0, end=20)) == [("a", 0, 10), ("b", 10, 20)]


def test_bad_announcements_are_skipped_not_fatal():
    peers = [
        span("neg", -1, 10),
        span("past", 0, 31),
        span("empty", 5, 5),
        span("slow", 0, 10, steps=0.0),
        span("nan", 0, 10, steps=float("nan")),
        span("ok", 0, 30),
    ]
    plan = plan_route(peers, 30, 1)
    assert chain(plan) == [("ok", 0, 30)]
    assert {pid for pid, why in plan.skipped if why == "bad_span"} == {"neg", "past", "empty", "slow", "nan"}


@pytest.mark.parametrize(
    "kw", [{"start": 5, "end": 5}, {"end": 31}, {"start": -1}, {"need_tokens": -1}, {"default_rtt_ms": -1.0}]
)
def test_bad_arguments(kw):
    args = {"need_tokens": 1}
    args.update(kw)
    with pytest.raises(RequestError):
        plan_route([span("a", 0, 30)], 30, **args)


def test_layers_only_unreachable_peers_announce_are_told_apart_from_missing_ones():
    import dataclasses
    import math

    peers = [dataclasses.replace(span("a", 0, 15), rtt_ms=math.inf, reachability="private"),
             dataclasses.replace(span("b", 15, 30), reachability="unknown")]
    with pytest.raises(NoRoute) as e:
        plan_route(peers, 30, 1, unreachable=frozenset({"b"}))
    text = str(e.value)
    assert text.startswith("layers 0:30 are announced, but by no peer that answers: 2 peer(s)")
    assert "1 of them announce private reachability" in text and "--public-address" in text
    assert e.value.missing == tuple(range(30))


def test_an_unreachable_peer_is_skipped_as_such_and_a_layer_nobody_announces_stays_missing():
    peers = [span("a", 0, 15, rtt=None), span("b", 0, 15)]
    plan = plan_route(peers, 15, 1, unreachable=frozenset({"a"}), exclude=frozenset({"a"}))
    assert chain(plan) == [("b", 0, 15)] and plan.skipped == (("a", "unreachable"),)
    with pytest.raises(NoRoute) as e:
        plan_route([span("a", 0, 15)], 30, 1, unreachable=frozenset({"a"}))
    assert str(e.value).startswith("no usable peer serves layers 0:30 (skipped: 1 announced but unreachable,")
    assert "; of these, layers 0:15 are announced only by peers that did not answer: crashed" in str(e.value)
