"""A stand-in for a span of transformer blocks: exact, cheap, and unforgiving of replay mistakes.

A hidden row is one 48-bit integer carried exactly in float32 as two 24-bit halves, `[rows, 2]`.
Each layer of a session keeps one integer of state (its "KV cache"); a row passing layer `l` does

    state_l <- ((state_l ^ v) * A + l + 1) mod 2**48,    v <- state_l ^ (state_l >> 17)

so a row's output depends on every earlier row of the session, in order, as attention does: a
replay that skipped, repeated or reordered a row changes every later output and the sampled token
(the last row mod VOCAB) with it. Layers compose: cutting the model between any two layers changes
nothing, so a chain of spans equals one peer serving every layer, and `reference_tokens` (the
whole model, no peers) is the fault-free run every generation must equal, at any swarm size.

Cost: a few integer operations per row per layer in Python (a 43-layer, 96-token generation is
about 2 ms of wall time), where a numpy stand-in costs microseconds per call per layer.

This module does not: model compute time (peers do, from their announced speeds) or sample.
"""

from __future__ import annotations

import numpy as np

HIDDEN = 2
"""Columns of a hidden row: the high and low 24 bits of a 48-bit integer."""
VOCAB = 50_000
"""Simulated vocabulary: the sampled token is the last row mod VOCAB."""
_MASK = (1 << 48) - 1
_A = 0x5DEECE66D  # java.util.Random's LCG multiplier: any odd 35-bit constant mixes well enough


def encode(values: list[int]) -> np.ndarray:
    """48-bit integers → `[len(values), HIDDEN]` float32 rows (exact: each half is below 2**24)."""
    return np.array([[v >> 24, v & 0xFFFFFF] for v in values], dtype=np.float32)


def decode(x: np.ndarray) -> list[int]:
    """`[rows, HIDDEN]` float32 rows → their 48-bit integers."""
    return [(int(hi) << 24) | int(lo) for hi, lo in x.astype(np.int64).tolist()]


def embed(token: int) -> np.ndarray:
    """The stand-in embedding of one token: `[1, HIDDEN]` float32, a function of the id alone."""
    return encode([((token + 1) * 0x9E3779B97F4A7C15) & _MASK])


def run_layers(state: list[int], start: int, x: np.ndarray) -> np.ndarray:
    """Run rows `x` (`[rows, HIDDEN]` float32) through layers start .. start + len(state) - 1.

    Args:
        state: one integer per layer of the span, updated in place (the session's cache).
        start: global index of the span's first layer.
        x: the rows, in position order.
    Returns:
        `[rows, HIDDEN]` float32, the rows after the span's last layer.
    """
    out = []
    for v in decode(x):
        for i in range(len(state)):
            s = ((state[i] ^ v) * _A + start + i + 1) & _MASK
            state[i] = s
            v = s ^ (s >> 17)
        out.append(v)
    return encode(out)


def token_of(x: np.ndarray) -> int:
    """The token a last span samples from its output rows: the last row mod VOCAB."""
    return decode(x[-1:])[0] % VOCAB


def reference_tokens(prompt: list[int], n_new: int, n_layers: int) -> list[int]:
    """The fault-free generation: the prompt, then `n_new` greedy tokens, through all layers at once."""
    state = [0] * n_layers
    tokens = [token_of(run_layers(state, 0, np.concatenate([embed(t) for t in prompt])))]
    while len(tokens) < n_new:
        tokens.append(token_of(run_layers(state, 0, embed(tokens[-1]))))
    return tokens
