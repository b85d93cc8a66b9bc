"""The verify group of a span: how many rows of one session's step it computes exactly as one-row steps.

A verify pass of speculative decoding (swarm/spec/verify.py) carries the last token and k drafted
tokens. Computed as one step of k + 1 rows it costs about one decode step on the CPU (the weights
are read once), but llama.cpp's kernels pick their matmul by row count, and some round a step of
many rows differently from one-row steps (Qwen2.5 0.5B Q4_K_M: repacked gemm from 4 rows up). A
pass is exact only in groups of rows that compute bit for bit as one-row steps, so each span
measures that group at load (`probe_exact_step_rows`) and tells clients in `OpenOk.verify_rows`;
a client verifies in groups of the smallest group of its route. Measured (docs/speculative.md):
SmolLM2 8 of 8 probed rows, Qwen2.5 0.5B 3.

This module does not: batch several sessions (swarm/peer/scheduler.py probes that) or read frames.
"""

from __future__ import annotations

import numpy as np

from swarm.errors import ExecutorError
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.peer.scheduler import probe_token_ids

VERIFY_PROBE_ROWS = 8
"""Largest verify group a span probes (and so announces): a pass of more rows goes in several groups."""

_HISTORY_ROWS = 5


def probe_exact_step_rows(ex: SpanExecutor, rows: int = VERIFY_PROBE_ROWS, *, seed: int = 0) -> int:
    """Largest g <= rows such that, for every n <= g, a step of n rows of one sequence gives the
    outputs of n one-row steps bit for bit, measured on random hidden states after a short history.

    Uses sequence 0, which must be empty, and leaves it empty.

    Args:
        ex: a span executor with sequence 0 empty.
        rows: the largest group to probe (capped at the executor's n_batch).
    Returns:
        1..rows.
    Raises:
        ExecutorError: sequence 0 is not empty, or llama.cpp failed.
    """
    rows = max(1, min(rows, ex.n_batch))
    if ex.pos_max(0) != -1:
        raise ExecutorError("the verify probe needs sequence 0 empty")
    rng = np.random.default_rng(seed)
    hist = rng.standard_normal((_HISTORY_ROWS, ex.n_embd)).astype(np.float32)
    xs = rng.standard_normal((rows, ex.n_embd)).astype(np.float32)
    hist_ids = probe_token_ids(ex, rng, _HISTORY_ROWS)
    ids = probe_token_ids(ex, rng, rows)

    def after_history() -> None:
        # clear and recompute rather than truncate: a recurrent state cannot roll back
        ex.clear(0)
        ex.forward(0, 0, hist, token_ids=hist_ids)

    def row_ids(a: int, b: int) -> np.ndarray | None:
        return None if ids is None else ids[a:b]

    try:
        after_history()
        solo = np.concatenate([ex.forward(0, _HISTORY_ROWS + i, xs[i : i + 1], all_logits=True,
                                          token_ids=row_ids(i, i + 1)) for i in range(rows)])
        best = 1
        for n in range(2, rows + 1):
            after_history()
            out = ex.forward(0, _HISTORY_ROWS, xs[:n], all_logits=True, token_ids=row_ids(0, n))
            if not np.array_equal(out, solo[:n]):
                break
            best = n
        return best
    finally:
        ex.clear(0)
