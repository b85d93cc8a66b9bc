"""Draft models on real GGUFs (swarm/client/draftmodel.py): the self-draft of SmolLM2 made once into
a cache, the tokenizer check, and a draft's KV cache after rejected drafts.

A draft's guesses depend on how its rows were batched (llama.cpp rounds a step of many rows
differently from one-row steps), so a draft that rolled back is compared with a fresh draft driven
through the same steps (the same batches at the same positions) without ever holding the rejected
tokens: equal proposals mean the rejected rows left nothing behind.
"""

from __future__ import annotations

import os

import pytest

from swarm.client.draftmodel import (
    SELF_DRAFT_TYPE,
    DraftWeights,
    check_same_tokenizer,
    load_draft,
    self_draft,
    self_draft_path,
)
from swarm.client.tokenizer import Tokenizer
from swarm.errors import ModelError
from swarm.ggml_bridge.gguf_header import scan
from swarm.manifest import build_manifest
from tests.helpers.synthetic import write_synthetic

Q4_0, Q4_1, Q4_K = 2, 3, 12
"""ggml type ids (gguf.GGMLQuantizationType)."""


@pytest.fixture(scope="module")
def drafts(smollm2_path, tmp_path_factory):
    """SmolLM2's self-draft at the default type, made into a fresh model cache: (path, cache)."""
    cache = tmp_path_factory.mktemp("models")
    path = self_draft(smollm2_path, build_manifest(smollm2_path).model_id, cache=cache)
    return path, cache


@pytest.fixture(scope="module")
def prompt(smollm2_path):
    return Tokenizer.from_gguf(smollm2_path).encode("Once upon a time, there was a lighthouse keeper who")


def test_the_self_draft_is_the_target_requantized_once_into_the_cache(smollm2_path, drafts):
    path, cache = drafts
    model_id = build_manifest(smollm2_path).model_id
    assert path == cache.parent / "drafts" / f"{model_id[:16]}-{SELF_DRAFT_TYPE}.gguf"
    assert path == self_draft_path(model_id, SELF_DRAFT_TYPE, cache)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # renamed into place
    target, draft = scan(smollm2_path), scan(path)
    assert draft.tensors.keys() == target.tensors.keys()
    types = {e.ggml_type for e in draft.tensors.values()}
    # SmolLM2's Q4_1 weights are all requantized: Q3_K_M's own picks for the 1536-wide rows (Q4_K,
    # Q5_K for ffn_down), llama.cpp's fallback for the 576-wide ones (Q4_0, Q5_0: not 256-multiples)
    assert Q4_1 not in types and {Q4_0, Q4_K} <= types
    assert path.stat().st_size < smollm2_path.stat().st_size
    check_same_tokenizer(path, smollm2_path)  # the tokenizer comes along
    stamp = path.stat().st_mtime_ns
    assert self_draft(smollm2_path, model_id, cache=cache) == path
    assert path.stat().st_mtime_ns == stamp  # cached: not made again


def test_a_draft_with_another_tokenizer_is_refused(smollm2_path, tmp_path):
    other = write_synthetic("llama", tmp_path / "llama.gguf")  # a 260-token byte vocabulary
    with pytest.raises(ModelError, match=r"its tokenizer differs \(tokenizer.ggml.model 'llama' vs 'gpt2'.*"
                                         r"tokenizer.ggml.tokens: 260 vs 49152 entries"):
        check_same_tokenizer(other, smollm2_path)
    with pytest.raises(ModelError, match="a draft model must have the target's tokenizer"):
        load_draft(str(other), smollm2_path, build_manifest(smollm2_path).model_id)


def test_gemma_cannot_draft_for_smollm2(smollm2_path, gemma_path):
    with pytest.raises(ModelError, match=r"tokenizer.ggml.tokens: 262144 vs 49152 entries"):
        check_same_tokenizer(gemma_path, smollm2_path)


def test_a_self_draft_needs_the_target_weights(smollm2_path):
    with pytest.raises(ModelError, match="it joined by model_id"):
        load_draft("self", smollm2_path, build_manifest(smollm2_path).model_id, whole=False)


def replay(weights: DraftWeights, calls: list[list[int]], k: int) -> list[int]:
    """A fresh draft driven through `calls` (one token proposed after each but the last), then
    proposing k after the last: the same steps as a draft that drafted and kept those tokens."""
    d = weights.draft(512)
    try:
        for tokens in calls[:-1]:
            d.propose(tokens, 1)
        return d.propose(calls[-1], k)
    finally:
        d.close()


@pytest.mark.parametrize("kept", [0, 2])
def test_rejected_drafts_leave_nothing_in_the_draft_cache(drafts, prompt, kept):
    path, _ = drafts
    d = DraftWeights(path).draft(512)
    first = d.propose(prompt, 4)
    miss = (first[kept] + 1) % 49152  # the target's token after the kept ones differs from the guess
    text = prompt + first[:kept] + [miss]
    after = d.propose(text, 4)
    assert d.cached == text + after[:-1]  # the rejected guesses are out of the cache
    # a fresh draft that computed the kept guesses as the first draft did (one-token steps after the
    # prompt's batch), and never the rejected ones
    calls = [prompt + first[:i] for i in range(kept + 1)] + [text]
    assert replay(DraftWeights(path), calls, 4) == after
    d.close()


def test_a_closed_draft_leaves_its_prompt_to_the_next_generation(drafts, prompt):
    path, _ = drafts
    weights = DraftWeights(path)
    d = weights.draft(512)
    d.propose(prompt + [12, 34], 4)
    d.close()
    again = weights.draft(512)
    got = again.propose(prompt, 4)
    # it took the closed draft's context: the prompt but its last token was already there
    assert again.cached == prompt + got[:-1]
    assert got == replay(DraftWeights(path), [prompt + [12, 34], prompt], 4)
    again.close()


def test_a_long_prompt_goes_in_batches_the_context_takes(drafts, prompt):
    # llama.cpp caps a context's batch at its size: a small generation's pooled context, taken by
    # a longer one, computes its prompt in batches of that size, and a 600-token prompt in two
    path, _ = drafts
    weights = DraftWeights(path)
    small = weights.draft(8)
    small.propose(prompt[:4], 2)
    small.close()
    long_prompt = (prompt * 60)[:600]
    for n_tokens in (250, 604):
        d = weights.draft(n_tokens)
        got = d.propose(long_prompt[: n_tokens - 4], 4)
        assert len(got) == 4 and d.cached == long_prompt[: n_tokens - 4] + got[:-1]
        d.close()


def test_proposals_stop_at_the_end_of_the_context(drafts, prompt):
    path, _ = drafts
    d = DraftWeights(path).draft(len(prompt) + 2)
    assert len(d.propose(prompt, 8)) == 3  # positions up to len(prompt) + 1 hold the text and 2 guesses
    assert d.propose(prompt, 0) == [] and d.propose([], 4) == []
    d.close()


def test_the_draft_cache_sits_beside_the_model_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SWARM_MODELS", os.fspath(tmp_path / "models"))
    assert self_draft_path("ab" * 32, "Q2_K") == tmp_path / "drafts" / f"{'ab' * 8}-Q2_K.gguf"
