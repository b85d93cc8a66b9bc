"""Span chains in-process: executors for consecutive spans of one model, and one forward through all.

The parity tests' runner (tests/parity): a chain of `SpanExecutor`s fed by a `TokenEmbedder` must equal
llama.cpp's whole model within TOL. This module builds and drives chains; it does not compare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.ggml_bridge.slicing import read_span_layers
from swarm.numeric import UBATCH_TOKENS
from tests.helpers.oracle import N_THREADS

TOL = 1e-4  # max |logit difference| a chain may have from the whole model


def open_chain(model_path: Path, cuts: tuple[int, ...], span_cache: Path, n_seq_max: int = 2,
               n_batch: int = UBATCH_TOKENS) -> list[SpanExecutor]:
    """Executors for the spans between `cuts`, in layer order; prefills in ubatches of n_batch rows
    (the grid of the numeric contract by default, as the peers and the oracles)."""
    _, n_layers = read_span_layers(model_path)
    bounds = [0, *cuts, n_layers]
    return [SpanExecutor.for_span(model_path, a, b, n_ctx_tokens=256, n_seq_max=n_seq_max,
                                  n_threads=N_THREADS, cache_dir=span_cache, n_batch=n_batch)
            for a, b in zip(bounds, bounds[1:])]


def chain_forward(chain: list[SpanExecutor], embedder: TokenEmbedder, seq_id: int, pos0: int,
                  ids: list[int], all_logits: bool = False) -> np.ndarray:
    """Embed `ids` and push them through every span (with the ids, for spans that read them);
    returns the last span's logits."""
    h = embedder.embed(ids)
    tok = np.asarray(ids, dtype=np.int32)
    for ex in chain[:-1]:
        h = ex.forward(seq_id, pos0, h, token_ids=tok)
        assert h.shape == (len(ids), ex.n_embd)
    return chain[-1].forward(seq_id, pos0, h, all_logits=all_logits, token_ids=tok)
