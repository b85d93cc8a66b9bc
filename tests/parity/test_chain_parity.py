"""A chain of span executors equals llama.cpp's whole model, bit for bit, on the real models.

Chain: TokenEmbedder -> SpanExecutor per span -> logits of the last span. The oracle is the
whole model fed token ids (tests/helpers/oracle.py). One runner (tests/helpers/chains.py),
parametrized over (model, cuts).
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.ggml_bridge.embed import TokenEmbedder
from tests.helpers.chains import TOL, chain_forward, open_chain
from tests.helpers.oracle import N_DECODE

CASES = [
    ("smollm2-135m", (15,)),
    ("smollm2-135m", (7, 22)),
    ("smollm2-135m", (1, 29)),
    ("qwen2.5-coder-0.5b", (12,)),
    ("qwen2.5-coder-0.5b", (5, 17)),
    ("gemma3-270m", (7,)),
    ("gemma3-270m", (4, 11)),
]


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
