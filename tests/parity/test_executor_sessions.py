"""Sessions on span executors: interleaving, rollback, export/import, chunked prefill, refusals.

All on SmolLM2 (fast) as a 2-span chain [0, 15) [15, 30), against runs of the same chain.
"""

from __future__ import annotations

import numpy as np
import pytest

from swarm.errors import ExecutorError
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.models import resolve_model
from tests.helpers.chains import TOL, chain_forward, open_chain

CUTS = (15,)
N_STEPS = 8


@pytest.fixture(scope="module")
def model_path():
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def embedder(model_path):
    return TokenEmbedder(model_path)


@pytest.fixture(scope="module")
def prompts(oracle_for, model_path):
    full = oracle_for(model_path).prompt
    return full, full[5:40]


@pytest.fixture
def chain(model_path, span_cache):
    execs = open_chain(model_path, CUTS, span_cache, n_seq_max=4)
    yield execs
    for ex in execs:
        ex.close()


def greedy(chain, embedder, seq_id, prompt, n_steps):
    """Prefill then greedy-decode; returns [1 + n_steps, n_vocab] logits (prefill's last row first)."""
    rows = [chain_forward(chain, embedder, seq_id, 0, prompt)[0]]
    pos = len(prompt)
    for _ in range(n_steps):
        rows.append(chain_forward(chain, embedder, seq_id, pos, [int(np.argmax(rows[-1]))])[0])
        pos += 1
    return np.stack(rows)


def test_interleaved_sessions_equal_solo_runs(chain, embedder, prompts):
    solo = []
    for p in prompts:
        solo.append(greedy(chain, embedder, 0, p, N_STEPS))
        for ex in chain:
            ex.clear(0)
        assert [ex.pos_max(0) for ex in chain] == [-1, -1]

    rows = {1: [chain_forward(chain, embedder, 1, 0, prompts[0])[0]]}
    rows[2] = [chain_forward(chain, embedder, 2, 0, prompts[1])[0]]
    pos = {1: len(prompts[0]), 2: len(prompts[1])}
    for _ in range(N_STEPS):
        for seq in (2, 1):
            nxt = int(np.argmax(rows[seq][-1]))
            rows[seq].append(chain_forward(chain, embedder, seq, pos[seq], [nxt])[0])
            pos[seq] += 1
    assert np.abs(np.stack(rows[1]) - solo[0]).max() <= TOL
    assert np.abs(np.stack(rows[2]) - solo[1]).max() <= TOL
    assert not np.array_equal(solo[0], solo[1])


def test_rollback_then_replay_is_identical(chain, embedder, prompts):
    prompt = prompts[0]
    first = greedy(chain, embedder, 0, prompt, N_STEPS)
    tokens = [int(np.argmax(r)) for r in first[:-1]]
    keep = len(prompt) + 3
    for ex in chain:
        ex.truncate(0, keep)
        assert ex.pos_max(0) == keep - 1
    replay = [chain_forward(chain, embedder, 0, p, [tokens[p - len(prompt)]])[0]
              for p in range(keep, len(prompt) + N_STEPS)]
    assert np.abs(np.stack(replay) - first[keep - len(prompt) + 1:]).max() <= TOL


def test_export_import_into_fresh_executor_continues_identically(chain, embedder, prompts, model_path,
                                                                  span_cache):
    prompt = prompts[0]
    logits = chain_forward(chain, embedder, 0, 0, prompt)[0]
    states = [ex.export_seq(0) for ex in chain]
    assert all(len(s) > 1000 for s in states)
    fresh = open_chain(model_path, CUTS, span_cache, n_seq_max=4)
    try:
        for ex, state in zip(fresh, states):
            ex.import_seq(3, state)
            assert ex.pos_max(3) == len(prompt) - 1
        pos, nxt = len(prompt), int(np.argmax(logits))
        for _ in range(N_STEPS):
            a = chain_forward(chain, embedder, 0, pos, [nxt])
            b = chain_forward(fresh, embedder, 3, pos, [nxt])
            assert np.abs(a - b).max() <= TOL
            pos, nxt = pos + 1, int(np.argmax(a))
        with pytest.raises(ExecutorError, match="not empty"):
            fresh[0].import_seq(3, states[0])
    finally:
        for ex in fresh:
            ex.close()


def test_chunked_prefill_matches_whole_model_with_same_batches(embedder, prompts, model_path, span_cache):
    """n_tokens > n_batch is split into llama_decode calls of n_batch, as llama.cpp's own eval does.

    llama.cpp's kernels depend on the batch size, so the reference is the whole model with the same
    n_batch (bit-exact), not the one-batch prefill (differs by up to ~2 logits on this model).
    """
    import llama_cpp

    prompt = prompts[0]
    llm = llama_cpp.Llama(str(model_path), n_ctx=256, n_batch=16, n_threads=2, n_threads_batch=2,
                          logits_all=True, flash_attn=True, verbose=False)
    try:
        llm.eval(prompt)
        reference = np.array(llm.scores[: len(prompt)], dtype=np.float32)
    finally:
        llm.close()
    small = open_chain(model_path, CUTS, span_cache, n_seq_max=1, n_batch=16)
    try:
        chunked = chain_forward(small, embedder, 0, 0, prompt, all_logits=True)
        assert [ex.pos_max(0) for ex in small] == [len(prompt) - 1] * 2
    finally:
        for ex in small:
            ex.close()
    assert chunked.shape == reference.shape
    assert np.abs(chunked - reference).max() <= TOL


def test_bad_inputs_are_refused_and_other_sessions_still_served(chain, embedder, prompts):
    first = chain[0]
    ids = prompts[1]
    reference = first.forward(1, 0, embedder.embed(ids))
    first.clear(1)
    good = embedder.embed(prompts[0][:10])
    first.forward(0, 0, good)

    nan = good.copy()
    nan[3, 7] = np.nan
    inf = good.copy()
    inf[0, 0] = np.inf
    bad_calls = {
        "wrong hidden size": lambda: first.forward(0, 10, np.zeros((2, first.n_embd + 1), np.float32)),
        "NaN": lambda: first.forward(0, 10, nan),
        "inf": lambda: first.forward(0, 10, inf),
        "gap in positions": lambda: first.forward(0, 12, good[:1]),
        "rewrite of positions": lambda: first.forward(0, 0, good[:1]),
        "negative position": lambda: first.forward(0, -1, good[:1]),
        "unknown seq id": lambda: first.forward(4, 0, good[:1]),
        "negative seq id": lambda: first.forward(-1, 0, good[:1]),
        "zero tokens": lambda: first.forward(0, 10, np.zeros((0, first.n_embd), np.float32)),
        "1-D hidden": lambda: first.forward(0, 10, good[0]),
        "int dtype": lambda: first.forward(0, 10, good.astype(np.int32)),
        "garbage state": lambda: first.import_seq(2, b"\x01\x02\x03" * 100),
        "truncated state": lambda: first.import_seq(2, first.export_seq(0)[:-100]),
        "empty state": lambda: first.import_seq(2, b""),
        "KV cache full": lambda: first.forward(2, 0, np.zeros((300, first.n_embd), np.float32)),
    }
    for what, call in bad_calls.items():
        with pytest.raises(ExecutorError):
            call()
        assert first.pos_max(0) == 9, what
        assert first.pos_max(2) == -1, what
    assert np.array_equal(first.forward(1, 0, embedder.embed(ids)), reference)
    first.close()
    with pytest.raises(ExecutorError, match="closed"):
        first.pos_max(0)
