"""What a verify pass accepts and how it is cut into steps (swarm/spec/verify.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from swarm.limits import MAX_VERIFY_ROWS
from swarm.sampling import SamplingParams, sample
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


# -- seeded sampling: a verify pass draws what plain sampling draws ------------------------------

VOCAB = 6


@functools.cache
def toy_logits(prev: int, position: int) -> np.ndarray:
    """A toy model: the next token's logits depend on the previous token and the position."""
    rng = np.random.default_rng([prev, position])
    return (rng.standard_normal(VOCAB) * 1.5).astype(np.float32)


def plain(prompt_last: int, pos: int, n: int, params: SamplingParams) -> list[int]:
    out, prev = [], prompt_last
    for i in range(n):
        prev = sample(toy_logits(prev, pos + i), params, position=pos + i + 1).token
        out.append(prev)
    return out


def speculative(prompt_last: int, pos: int, n: int, params: SamplingParams, guess: list[int]) -> list[int]:
    """Passes of the token so far and drafted `guess`: row i is computed on its own input token,
    sampled at its position (as the last span does), then `accepted` keeps the matching prefix."""
    out, prev, at = [], prompt_last, pos
    while len(out) < n:
        rows = [prev, *guess]
        sampled = [sample(toy_logits(t, at + i), params, position=at + i + 1).token
                   for i, t in enumerate(rows)]
        new = accepted(guess, sampled)
        out += new
        prev, at = new[-1], at + len(new)
    return out[:n]


def test_seeded_speculative_sampling_draws_exactly_what_plain_sampling_draws():
    params = SamplingParams(temperature=0.9, top_k=5)
    kept = 0
    for seed in range(100):
        p = SamplingParams(temperature=params.temperature, top_k=params.top_k, seed=seed)
        want = plain(3, 10, 8, p)
        assert speculative(3, 10, 8, p, [want[0], 1, 2]) == want  # the first guess is right
        assert speculative(3, 10, 8, p, [0, 0, 0]) == want
        kept += sum(a == b for a, b in zip(want, [0, 0, 0]))
    assert kept > 0  # some guesses were kept, not only rejected


def test_first_token_and_per_position_distributions_equal_the_model_over_many_seeds():
    # chi-square of the speculative tokens at positions 1 and 2 against the model's exact marginal
    # distribution (enumerated), over a fixed set of 2000 seeds: deterministic, and would fail for
    # an acceptance rule that biased the output towards the guess
    from scipy.stats import chisquare

    n_seeds, guess = 2000, [1, 1]
    counts = np.zeros((2, VOCAB))
    for seed in range(n_seeds):
        out = speculative(3, 10, 2, SamplingParams(temperature=1.0, seed=seed), guess)
        counts[0, out[0]] += 1
        counts[1, out[1]] += 1
    p0 = np.exp(toy_logits(3, 10).astype(np.float64))
    p0 /= p0.sum()
    p1 = np.zeros(VOCAB)
    for t0 in range(VOCAB):
        q = np.exp(toy_logits(t0, 11).astype(np.float64))
        p1 += p0[t0] * q / q.sum()
    for row, p in ((0, p0), (1, p1)):
        assert chisquare(counts[row], p * n_seeds).pvalue > 0.01
    # and the guess is drawn no more often than the model gives it
    assert abs(counts[0, 1] / n_seeds - p0[1]) < 4 * np.sqrt(p0[1] * (1 - p0[1]) / n_seeds)
