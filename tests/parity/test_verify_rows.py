"""The verify group (swarm/peer/exact_rows.py): rows of one session's step that compute exactly as
one-row steps, probed per span at load, and what a verify pass in larger groups would change.

Measured on the real models: greedy decode steps one row at a time, then the same tokens again in
steps of g rows from the same prefix; a group is exact when every row's logits are bit-equal.
SmolLM2: every group up to the probe's 8 rows. Qwen2.5 0.5B Q4_K_M: up to 3 (ggml-cpu's repacked
Q4_K gemm from 4 rows up rounds differently); in groups of 4 or more its logits drift, and the test
asserts the measured greedy agreement there (docs/speculative.md quotes it).
"""

from __future__ import annotations

import numpy as np

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.peer.exact_rows import VERIFY_PROBE_ROWS, probe_exact_step_rows
from tests.helpers.chains import chain_forward, open_chain

N_DECODE = 40


def decode_then_regroup(path, span_cache, oracle, groups):
    """Logits of N_DECODE greedy one-row steps after the parity prompt, and the same tokens' logits
    when stepped in groups of each g in `groups`: (probe of the whole-model span, plain, {g: logits})."""
    [ex] = open_chain(path, (), span_cache, n_seq_max=1)
    try:
        probed = probe_exact_step_rows(ex)
        emb = TokenEmbedder(path)
        prompt = oracle.prompt
        logits = chain_forward([ex], emb, 0, 0, prompt)
        toks, plain = [int(np.argmax(logits[-1]))], []
        for i in range(N_DECODE):
            row = chain_forward([ex], emb, 0, len(prompt) + i, [toks[-1]])[-1]
            plain.append(row)
            toks.append(int(np.argmax(row)))
        regrouped = {}
        for g in groups:
            ex.truncate(0, len(prompt))
            outs = [chain_forward([ex], emb, 0, len(prompt) + a, toks[a : min(a + g, N_DECODE)],
                                  all_logits=True)
                    for a in range(0, N_DECODE, g)]
            regrouped[g] = np.concatenate(outs)
        return probed, np.stack(plain), regrouped
    finally:
        ex.close()


def test_smollm2_verifies_exactly_in_every_probed_group(smollm2_path, span_cache, oracle_for):
    probed, plain, regrouped = decode_then_regroup(smollm2_path, span_cache, oracle_for(smollm2_path),
                                                   range(1, VERIFY_PROBE_ROWS + 1))
    assert probed == VERIFY_PROBE_ROWS
    for g, got in regrouped.items():
        assert np.array_equal(got, plain), f"group {g}"


def test_qwen_verifies_exactly_in_groups_of_3_and_drifts_from_4(qwen_path, span_cache, oracle_for):
    probed, plain, regrouped = decode_then_regroup(qwen_path, span_cache, oracle_for(qwen_path), (3, 4, 5))
    assert probed == 3
    assert np.array_equal(regrouped[3], plain)
    for g in (4, 5):
        assert not np.array_equal(regrouped[g], plain)
        agree = int(np.sum(np.argmax(regrouped[g], 1) == np.argmax(plain, 1)))
        assert agree == AGREEMENT[g], f"group {g}: greedy token agreement {agree}/{N_DECODE}"


AGREEMENT = {4: N_DECODE, 5: N_DECODE}
"""Greedy tokens (of N_DECODE) that verify groups of 4 and 5 rows still agree on for Qwen (measured)."""
