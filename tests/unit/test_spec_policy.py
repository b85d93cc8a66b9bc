"""The adaptive draft length (swarm/spec/policy.py): pure decisions from fed measurements."""

from __future__ import annotations

import pytest

from swarm.spec.policy import KPolicy, expected_tokens, shadow_kept, worth_sending_ahead

pytestmark = pytest.mark.quick


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_a_pass_is_sent_ahead_only_where_it_is_likely_to_be_used():
    # used only when the pass before keeps all k drafts and the guess after them holds: a^(k+1)
    assert worth_sending_ahead(0.93, 4)  # 0.70: Qwen copying code with prompt lookup
    assert worth_sending_ahead(0.93, 8)  # 0.52
    assert not worth_sending_ahead(0.75, 4)  # 0.24: a self-draft on novel text, long drafts
    assert worth_sending_ahead(0.75, 2)  # 0.42: the same, short drafts
    assert not worth_sending_ahead(0.3, 1)


def _trained(step_ms: float, row_ms: float, drafted: int, kept: int, passes: int = 20) -> KPolicy:
    """A policy fed `passes` plain steps and verify passes of `drafted` rows keeping `kept`."""
    p = KPolicy(k_max=4)
    for _ in range(passes):
        p.observe_pass(0, 0, step_ms)
        p.observe_pass(drafted, kept, step_ms + drafted * row_ms)
    return p


def test_explores_a_plain_step_then_a_full_draft_before_it_can_fit():
    p = KPolicy(k_max=4)
    assert p.choose() == 0
    p.observe_pass(0, 0, 10.0)
    assert p.choose() == 4


def test_the_exploring_pass_drafts_one_exact_row_group():
    # Qwen's route proves groups of 3 rows exact: exploring with 2 drafts costs each hop one step
    p = KPolicy(k_max=4, explore=2)
    assert p.choose() == 0
    p.observe_pass(0, 0, 10.0)
    assert p.choose() == 2
    p.observe_pass(2, 0, 20.0)  # the guesses failed, and a row costs half a step: off
    assert p.choose() == 0


def test_explore_must_lie_within_one_and_k_max():
    for bad in (0, 5):
        with pytest.raises(ValueError, match="explore"):
            KPolicy(k_max=4, explore=bad)


def test_round_trips_dominating_a_pass_draft_the_most():
    # a WAN: a pass is 150 ms of round trips, a drafted row 1 ms; acceptance 0.9
    p = _trained(150.0, 1.0, 4, 4)
    p.observe_acceptance(10, 9)
    assert p.choose() == 4


def test_low_acceptance_where_rows_cost_like_steps_turns_speculation_off():
    # one machine's loopback: a drafted row costs almost a step, and drafts are rarely accepted
    p = _trained(10.0, 8.0, 4, 0)
    assert p.acceptance < 0.1
    assert p.choose() == 0


def test_the_draft_models_own_cost_counts_against_long_drafts():
    cheap = _trained(20.0, 1.0, 4, 2)
    costly = _trained(20.0, 1.0, 4, 2)
    for _ in range(10):
        costly.observe_draft(4, 40.0)  # 10 ms per drafted token
    assert cheap.choose() > costly.choose()


def test_shadow_drafts_bring_speculation_back_when_the_text_turns_to_copying():
    p = _trained(10.0, 8.0, 4, 0)
    assert p.choose() == 0
    wanted = [p.wants_shadow() for _ in range(16)]
    assert wanted.count(True) == 2 and wanted[p.probe_every - 1]
    for _ in range(30):  # shadows that the decoded text confirms in full
        p.observe_acceptance(4, 4)
    assert p.acceptance > 0.9 and p.choose() > 0


def test_a_costly_draft_draws_no_shadows():
    # loopback: a plain step 25 ms, a draft model as slow as the target (20 ms a token) whose guesses
    # are kept half the time: off, and no shadows (each would catch up on every step since the last)
    costly = _trained(25.0, 20.0, 4, 2)
    for _ in range(30):
        costly.observe_draft(4, 80.0)
    assert costly.choose() == 0
    assert not any(costly.wants_shadow() for _ in range(64))
    # prompt lookup's 0.01 ms a token is under 5% of a step: shadows every probe_every steps
    cheap = _trained(25.0, 20.0, 4, 2)
    cheap.observe_draft(4, 0.04)
    assert [cheap.wants_shadow() for _ in range(16)].count(True) == 2


def test_shadow_kept_waits_for_enough_decoded_tokens():
    assert shadow_kept([5, 6, 7], [5, 6]) is None
    assert shadow_kept([5, 6, 7], [5, 6, 7, 8]) == 3
    assert shadow_kept([5, 6, 7], [5, 9]) == 1
    assert shadow_kept([5, 6, 7], [4]) == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        KPolicy(k_max=0)
    with pytest.raises(ValueError):
        KPolicy(k_max=4, probe_every=0)
