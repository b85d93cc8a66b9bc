"""A chain of span executors equals llama.cpp's whole model, bit for bit, on the real models.

Chain: TokenEmbedder -> SpanExecutor per span -> logits of the last span. The oracle is the
whole model fed token ids (see conftest.py). One runner, parametrized over (model, cuts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.ggml_bridge.slicing import read_span_layers
from tests.helpers.oracle import N_DECODE, N_THREADS

TOL = 1e-4

CASES = [
    ("smollm2-135m", (15,)),
    ("smollm2-135m", (7, 22)),
    ("smollm2-135m", (1, 29)),
    ("qwen2.5-coder-0.5b", (12,)),
    ("qwen2.5-coder-0.5b", (5, 17)),
    ("gemma3-270m", (7,)),
    ("gemma3-270m", (4, 11)),
]


def open_chain(model_path: Path, cuts: tuple[int, ...], span_cache: Path, n_seq_max: int = 2,
               n_batch: int = 512) -> list[SpanExecutor]:
    """Executors for the spans between `cuts`, in layer order."""
    _, n_layers = read_span_layers(model_path)
    bounds = [0, *cuts, n_layers]
    return [SpanExecutor.for_span(model_path, a, b, n_ctx_tokens=256, n_seq_max=n_seq_max,
                                  n_threads=N_THREADS, cache_dir=span_cache, n_batch=n_batch)
            for a, b in zip(bounds, bounds[1:])]


def chain_forward(chain: list[SpanExecutor], embedder: TokenEmbedder, seq_id: int, pos0: int,
                  ids: list[int], all_logits: bool = False) -> np.ndarray:
    """Embed `ids` and push them through every span; returns the last span's logits."""
    h = embedder.embed(ids)
    for ex in chain[:-1]:
        h = ex.forward(seq_id, pos0, h)
        assert h.shape == (len(ids), ex.n_embd)
    return chain[-1].forward(seq_id, pos0, h, all_logits=all_logits)


@pytest.mark.parametrize("model,cuts", CASES, ids=[f"{m}-{'-'.join(map(str, c))}" for m, c in CASES])
def test_chain_matches_whole_model(model, cuts, span_cache, oracle_for):
    from swarm.models import resolve_model

    path = resolve_model(model)
    oracle = oracle_for(path)
    embedder = TokenEmbedder(path)
    chain = open_chain(path, cuts, span_cache)
    try:
        assert [ex.is_last for ex in chain] == [False] * len(cuts) + [True]
        assert all(ex.n_vocab == 1 for ex in chain[:-1])
        prefill = chain_forward(chain, embedder, 0, 0, oracle.prompt, all_logits=True)
        assert prefill.shape == oracle.prefill_logits.shape
        assert np.abs(prefill - oracle.prefill_logits).max() <= TOL

        pos = len(oracle.prompt)
        nxt = int(np.argmax(prefill[-1]))
        got_tokens, max_diff = [], 0.0
        for i in range(N_DECODE):
            got_tokens.append(nxt)
            logits = chain_forward(chain, embedder, 0, pos, [nxt])
            assert logits.shape == (1, oracle.step_logits.shape[1])
            max_diff = max(max_diff, float(np.abs(logits[0] - oracle.step_logits[i]).max()))
            pos += 1
            nxt = int(np.argmax(logits[0]))
        assert got_tokens == oracle.tokens
        assert max_diff <= TOL
        assert [ex.pos_max(0) for ex in chain] == [pos - 1] * len(chain)
    finally:
        for ex in chain:
            ex.close()
