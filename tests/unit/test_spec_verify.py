"""What a verify pass accepts and how it is cut into steps (swarm/spec/verify.py)."""

from __future__ import annotations

import pytest

from swarm.limits import MAX_VERIFY_ROWS
from swarm.spec.verify import Acceptance, accepted, draft_budget, verify_steps


@pytest.mark.parametrize(
    "draft, sampled, new",
    [
        ([5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8]),  # all kept, plus the token after the last row
        ([5, 6, 7], [5, 9, 7, 8], [5, 9]),  # the second differs: the sampled one replaces it
        ([5, 6, 7], [4, 6, 7, 8], [4]),  # none kept: the pass still yields one token
        ([], [3], [3]),
    ],
)
def test_accepts_the_longest_matching_prefix_then_the_sampled_token(draft, sampled, new):
    assert accepted(draft, sampled) == new


def test_a_sampled_list_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError):
        accepted([1, 2], [1, 2])


def test_verify_steps_groups_rows():
    assert verify_steps(5, 1) == (1, 1, 1, 1, 1)
    assert verify_steps(5, 2) == (2, 2, 1)
    assert verify_steps(5, 5) == () and verify_steps(5, 16) == ()
    with pytest.raises(ValueError):
        verify_steps(0, 1)


def test_draft_budget_stays_inside_the_request_and_the_frame():
    assert draft_budget(4, generated=1, max_new_tokens=100) == 4
    # 10 generated of 12: one pass may add at most 2 tokens, so one drafted token
    assert draft_budget(4, generated=10, max_new_tokens=12) == 1
    assert draft_budget(4, generated=11, max_new_tokens=12) == 0
    assert draft_budget(500, generated=1, max_new_tokens=10_000) == MAX_VERIFY_ROWS - 1


def test_acceptance_counts():
    a = Acceptance()
    assert a.rate == 0.0 and a.tokens_per_pass == 0.0
    a.add(4, 4)
    a.add(4, 0)
    assert (a.passes, a.drafted, a.accepted) == (2, 8, 4)
    assert a.rate == 0.5 and a.tokens_per_pass == 3.0
