"""Spot-check logic (swarm/route/verify.py): the measure, the band, the schedule, the standing."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from swarm.route.plan import PeerSpan, plan_route
from swarm.route.verify import (
    DEFAULT_BAND, Band, CheckPolicy, CheckSchedule, Standing, band_for, compare, compare_tokens, quant_type,
    rewind_position,
)


def rows(n: int = 4, hidden: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float32)


def test_equal_blocks_measure_zero_and_pass():
    x = rows()
    m = compare(x, x.copy())
    assert (m.rel_l2, m.row) == (0.0, 0)
    assert m.cosine == pytest.approx(1.0)
    assert m.within(DEFAULT_BAND)


def test_the_worst_row_decides_and_is_named():
    ref = rows(6)
    claimed = ref.copy()
    claimed[4] += 0.1 * ref[4]  # 10% off on row 4 only
    m = compare(claimed, ref)
    assert m.row == 4
    assert m.rel_l2 == pytest.approx(0.1, rel=1e-6)
    assert not m.within(Band(max_rel_l2=0.05, min_cosine=0.0))
    assert m.within(Band(max_rel_l2=0.2, min_cosine=0.0))


def test_a_scaled_row_fails_on_rel_l2_though_its_cosine_is_one():
    ref = rows(2)
    m = compare(ref * 1.01, ref)
    assert m.cosine == pytest.approx(1.0)
    assert m.rel_l2 == pytest.approx(0.01, rel=1e-5)
    assert not m.within(Band(max_rel_l2=1e-3, min_cosine=0.999))


def test_a_non_finite_claimed_row_is_infinitely_far():
    ref = rows(3)
    claimed = ref.copy()
    claimed[1, 5] = np.nan
    m = compare(claimed, ref)
    assert (m.row, m.rel_l2, m.cosine) == (1, math.inf, -1.0)
    assert not m.within(DEFAULT_BAND)


def test_first_outside_is_the_first_row_past_the_band_not_the_worst():
    ref = rows(6)
    claimed = ref.copy()
    claimed[2] += 0.05 * ref[2]
    claimed[4] += 0.5 * ref[4]  # the worst row comes later
    m = compare(claimed, ref, Band(max_rel_l2=0.03, min_cosine=0.0))
    assert (m.row, m.first_outside) == (4, 2)
    assert compare(claimed, ref).first_outside == -1  # no band, no decision
    assert compare(ref.copy(), ref, DEFAULT_BAND).first_outside == -1
    claimed[1, 0] = np.inf  # a non-finite row is outside any band
    assert compare(claimed, ref, Band(max_rel_l2=10.0, min_cosine=-1.0)).first_outside == 1


def test_a_repair_rolls_back_to_the_token_after_the_first_wrong_row_never_into_the_prompt():
    # prompt of 10 tokens, route at 30: a wrong row 20 makes the token at 21 and later suspect
    assert rewind_position(20, 10, 30) == 21
    assert rewind_position(3, 10, 30) == 10  # wrong in the prompt: its first token is recomputed
    assert rewind_position(29, 10, 30) == 30  # the last row: only the token being decoded
    assert rewind_position(0, 0, 5) == 1


def test_blocks_of_other_shapes_are_refused():
    with pytest.raises(ValueError):
        compare(rows(2), rows(3))


def test_the_schedule_checks_the_first_step_then_at_its_rate_repeatably():
    policy = CheckPolicy(rate=0.25, first_check_step=2, seed=7)
    due = [[s for s in range(2000) if sched.due(s)] for sched in
           (CheckSchedule(policy, random.Random(7)), CheckSchedule(policy, random.Random(7)))]
    assert due[0] == due[1]  # a seeded schedule is the same every run
    assert due[0][0] == 2 and 0 not in due[0] and 1 not in due[0]
    assert 0.2 < len(due[0]) / 2000 < 0.3


def test_rate_zero_checks_only_the_first_step_and_the_sweeps():
    sched = CheckSchedule(CheckPolicy(rate=0.0, first_check_step=3, sweep_steps=0), random.Random(1))
    assert [s for s in range(500) if sched.due(s)] == [3]
    sched = CheckSchedule(CheckPolicy(rate=0.0, first_check_step=3, sweep_steps=40), random.Random(1))
    due = [(s, sched.due(s)) for s in range(130)]
    assert [(s, k) for s, k in due if k] == [(3, "sweep"), (43, "sweep"), (83, "sweep"), (123, "sweep")]


def test_random_checks_between_sweeps_check_one_hop():
    sched = CheckSchedule(CheckPolicy(rate=0.5, first_check_step=2, sweep_steps=40, seed=1), random.Random(1))
    due = {s: sched.due(s) for s in range(200)}
    assert {s for s, k in due.items() if k == "sweep"} == {2, 42, 82, 122, 162}
    assert 60 < sum(k == "one" for k in due.values()) < 130 and due[0] is None and due[1] is None


def test_no_first_check_means_no_sweeps():
    sched = CheckSchedule(CheckPolicy(rate=0.0, first_check_step=-1), random.Random(1))
    assert not any(sched.due(s) for s in range(500))


def test_a_negative_sweep_period_is_refused():
    with pytest.raises(ValueError, match="sweep_steps"):
        CheckPolicy(sweep_steps=-1)


def test_hops_are_checked_in_turn():
    sched = CheckSchedule(CheckPolicy(), random.Random(3))
    picks = [sched.pick([4, 9]) for _ in range(6)]
    assert sorted(picks[:2]) == [4, 9] and picks[:2] * 3 == picks


def test_a_rate_outside_zero_one_is_refused():
    with pytest.raises(ValueError):
        CheckPolicy(rate=1.5)


def test_standing_adds_a_penalty_per_offence_in_its_window():
    s = Standing(CheckPolicy(penalty_ms=100.0, standing_window_s=50.0))
    assert s.record("liar", 0.0) == 1
    assert s.record("liar", 10.0) == 2
    assert s.penalties(20.0) == {"liar": 200.0}
    assert s.penalties(55.0) == {"liar": 100.0}  # the first offence left the window
    assert s.penalties(61.0) == {}


def span(peer_id: str, start: int, end: int) -> PeerSpan:
    return PeerSpan(peer_id, start, end, 100.0, 1000.0, 4096, 4, rtt_ms=1.0)


def test_a_penalised_peer_loses_its_place_in_the_route_but_serves_when_alone():
    peers = [span("a-fast", 0, 10), span("b-slower", 0, 10)]
    peers[1] = PeerSpan("b-slower", 0, 10, 50.0, 1000.0, 4096, 4, rtt_ms=1.0)
    assert plan_route(peers, 10, 8).hops[0].peer_id == "a-fast"
    assert plan_route(peers, 10, 8, penalty_ms={"a-fast": 1000.0}).hops[0].peer_id == "b-slower"
    assert plan_route(peers[:1], 10, 8, penalty_ms={"a-fast": 1000.0}).hops[0].peer_id == "a-fast"


def test_quant_type_names_the_gguf_file_type():
    assert quant_type({"general.file_type": 3}) == "MOSTLY_Q4_1"
    assert quant_type({}) == ""
    assert quant_type({"general.file_type": "junk"}) == ""


def test_the_band_is_looked_up_by_architecture_and_quantization():
    assert "SmolLM2" in band_for("llama", "MOSTLY_Q4_1").source
    assert "Qwen2.5" in band_for("qwen2", "MOSTLY_Q4_K_M").source
    assert band_for("llama", "MOSTLY_Q8_0") is DEFAULT_BAND


def test_tokens_are_compared_at_the_positions_both_hold_and_the_first_difference_is_named():
    claimed = {10: 5, 11: 7, 12: 9, 13: 4}
    assert compare_tokens(claimed, {10: 5, 11: 7, 12: 9}).within(DEFAULT_BAND)  # 13 not replayed
    m = compare_tokens(claimed, {10: 5, 11: 8, 12: 1, 13: 4, 14: 3})
    assert not m.within(DEFAULT_BAND)
    # the token at 11 came from the row at 10: the repair recomputes from position 11
    assert (m.first_outside, m.row, rewind_position(m.first_outside, 3, 14)) == (10, 10, 11)
    assert compare_tokens({}, {1: 2}).first_outside == -1
