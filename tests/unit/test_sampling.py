"""swarm.sampling: greedy, filters, seeded per-position draws, log-probs."""

import dataclasses
import math

import numpy as np
import pytest

from swarm.errors import RequestError
from swarm.sampling import SamplingParams, distribution, sample

LOGITS = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
Z = sum(math.exp(v) for v in (2.0, 1.0, 0.0, -1.0))


def test_greedy_is_argmax_with_lowest_id_on_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(1000).astype(np.float32)
        assert sample(x, SamplingParams(), position=3).token == int(np.argmax(x))
    tie = np.array([0.0, 5.0, 1.0, 5.0], dtype=np.float32)
    assert sample(tie, SamplingParams(), 0).token == 1


def test_logprob_and_top_are_log_softmax_of_raw_logits():
    r = sample(LOGITS, SamplingParams(n_top_logprobs=3), 0)
    assert r.token == 0
    assert r.logprob == pytest.approx(2.0 - math.log(Z), abs=1e-6)
    assert [i for i, _ in r.top] == [0, 1, 2]
    assert [lp for _, lp in r.top] == pytest.approx([v - math.log(Z) for v in (2.0, 1.0, 0.0)], abs=1e-6)
    tie = sample(np.array([1.0, 3.0, 3.0, 1.0], np.float32), SamplingParams(n_top_logprobs=4), 0)
    assert [i for i, _ in tie.top] == [1, 2, 0, 3]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)])
def test_logprob_only_when_asked_and_the_same_token_either_way(params):
    plain = sample(LOGITS, params, 5)
    asked = sample(LOGITS, dataclasses.replace(params, logprobs=True), 5)
    assert plain.logprob is None and plain.top == ()
    assert asked.token == plain.token
    assert asked.logprob == pytest.approx(float(LOGITS[asked.token]) - math.log(Z), abs=1e-6)


def test_hand_computed_distributions():
    ids, p = distribution(LOGITS, SamplingParams(temperature=1.0))
    assert list(ids) == [0, 1, 2, 3]
    assert p == pytest.approx([math.exp(v) / Z for v in (2.0, 1.0, 0.0, -1.0)])
    ids, p = distribution(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert list(ids) == [0, 1]
    assert p == pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)])
    # softmax = [.644, .237, .087, .032]: cumulative .644, .881 -> top_p .8 keeps two tokens
    ids, p = distribution(LOGITS, SamplingParams(temperature=0.5, top_p=0.8))
    assert list(ids) == [0, 1]
    z = math.exp(4) + math.exp(2)
    assert p == pytest.approx([math.exp(4) / z, math.exp(2) / z])
    ids, _ = distribution(LOGITS, SamplingParams(temperature=1.0, top_p=0.9))
    assert list(ids) == [0, 1, 2]


def test_same_seed_and_position_replays_same_token():
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    p = SamplingParams(temperature=1.5, top_p=0.95, top_k=100, seed=42)
    a = [sample(x, p, pos).token for pos in range(50)]
    assert a == [sample(x, p, pos).token for pos in range(50)]
    assert len(set(a)) > 5  # positions draw differently


def test_draws_follow_the_distribution_and_seed_matters():
    p1, p2 = SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0, seed=2)
    n = 2000
    t1 = np.array([sample(LOGITS, p1, pos).token for pos in range(n)])
    t2 = np.array([sample(LOGITS, p2, pos).token for pos in range(n)])
    expected = np.array([math.exp(v) / Z for v in (2.0, 1.0, 0.0, -1.0)])
    for t in (t1, t2):
        freq = np.bincount(t, minlength=4) / n
        assert np.abs(freq - expected).max() < 0.04  # ~4 sigma at n=2000
    assert (t1 != t2).mean() > 0.3  # two seeds are independent streams (expected ~0.51)


def test_top_k_1_and_tiny_top_p_are_greedy():
    x = np.random.default_rng(3).standard_normal(2000).astype(np.float32)
    want = int(np.argmax(x))
    for pos in range(30):
        assert sample(x, SamplingParams(temperature=2.0, top_k=1, seed=pos), pos).token == want
        assert sample(x, SamplingParams(temperature=2.0, top_p=1e-9, seed=pos), pos).token == want


def test_masked_tokens_are_never_drawn():
    x = np.array([0.0, -np.inf, 0.0, -np.inf], np.float32)
    toks = {sample(x, SamplingParams(temperature=1.0), pos).token for pos in range(200)}
    assert toks == {0, 2}


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.01},
        {"top_k": -1},
        {"top_k": 1.5},
        {"seed": -1},
        {"seed": 2**64},
        {"n_top_logprobs": 21},
        {"top_k": True},
    ],
)
def test_bad_params_raise(kw):
    with pytest.raises(RequestError):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    "logits",
    [
        np.zeros((2, 3), np.float32),
        np.zeros(0, np.float32),
        np.array([1.0, np.nan], np.float32),
        np.array([1, 2]),
        np.array([-np.inf, -np.inf]),
        np.array([np.inf, 0.0]),
    ],
)
def test_bad_logits_raise(logits):
    with pytest.raises(RequestError):
        sample(logits, SamplingParams(), 0)


def test_bad_position_raises():
    with pytest.raises(RequestError):
        sample(LOGITS, SamplingParams(temperature=1.0), -1)
    with pytest.raises(RequestError, match="greedy"):
        distribution(LOGITS, SamplingParams())
