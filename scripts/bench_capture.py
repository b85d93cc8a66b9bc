#!/usr/bin/env python
"""What the boundary capture costs a span: the measurement behind keeping the eval-callback
capture for every architecture but deepseek4 (docs/layer-range.md, issue 26 item 3).

A non-final span hands its residual on through the scheduler's eval callback (csrc/swarm_span.c
`capture_cb`, which makes ggml stop at the boundary tensor and copy its rows out). The alternative,
a layer-range API that returns the residual as the graph's output, would save exactly that. Both
sides run the same span file (layers [0, end) of the model), the same context settings (1 thread
for one-row steps, flash attention on, per-sequence KV, n_ubatch UBATCH_TOKENS) and the same steps
(a 64-row prefill, then one-row decode steps), interleaved in rounds:

- "capture": `SpanExecutor.forward`, the peers' path (callback on, rows copied out);
- "no capture": the same span through llama-cpp-python's low-level `llama_decode` with no
  callback (the rows are computed and not read: the floor any output API could reach).

Prints JSON: ms per decode step (median of the rounds) for each and the ratio capture / no capture.

Usage: scripts/bench_capture.py [--model smollm2-135m] [--end 15] [--steps 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.ggml_bridge.executor import SpanExecutor  # noqa: E402
from swarm.ggml_bridge.slicing import build_span  # noqa: E402
from swarm.models import resolve_model  # noqa: E402
from swarm.numeric import UBATCH_TOKENS  # noqa: E402

N_CTX = 1024
PREFILL = 64


def _capture_ms(ex: SpanExecutor, xs: np.ndarray, seq: int) -> float:
    ex.clear(seq)
    ex.forward(seq, 0, xs[:PREFILL])
    t0 = time.perf_counter()
    for i in range(PREFILL, len(xs)):
        ex.forward(seq, i, xs[i:i + 1])
    return (time.perf_counter() - t0) * 1e3 / (len(xs) - PREFILL)


class _Plain:
    """The same span through llama-cpp-python's low-level API, with no eval callback."""

    def __init__(self, span: Path, n_embd: int):
        import llama_cpp as L
        self.L = L
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(span).encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = N_CTX, UBATCH_TOKENS, UBATCH_TOKENS, 1
        cp.n_threads, cp.n_threads_batch = 1, 2
        cp.flash_attn_type = 1
        cp.kv_unified = False
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.batch = L.llama_batch_init(UBATCH_TOKENS, n_embd, 1)
        self.n_embd = n_embd

    def decode(self, x: np.ndarray, pos0: int) -> None:
        b = self.batch
        n = x.shape[0]
        b.n_tokens = n
        ctypes.memmove(b.embd, x.ctypes.data, x.nbytes)
        for i in range(n):
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def ms(self, xs: np.ndarray) -> float:
        self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.ctx), 0, -1, -1)
        self.decode(xs[:PREFILL], 0)
        t0 = time.perf_counter()
        for i in range(PREFILL, len(xs)):
            self.decode(xs[i:i + 1], i)
        return (time.perf_counter() - t0) * 1e3 / (len(xs) - PREFILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--end", type=int, default=15, help="the span is layers [0, end)")
    ap.add_argument("--steps", type=int, default=200, help="one-row decode steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    path = resolve_model(args.model)
    span = build_span(path, 0, args.end)
    ex = SpanExecutor.for_span(path, 0, args.end, n_ctx_tokens=N_CTX, n_seq_max=1, n_threads=2,
                               n_batch=UBATCH_TOKENS)
    xs = (np.random.default_rng(0).standard_normal((PREFILL + args.steps, ex.n_embd)) * 0.1).astype(np.float32)
    plain = _Plain(span, ex.n_embd)
    cap, raw = [], []
    for _ in range(args.rounds):
        cap.append(_capture_ms(ex, xs, 0))
        raw.append(plain.ms(xs))
    c, r = statistics.median(cap), statistics.median(raw)
    print(json.dumps({"model": args.model, "span": [0, args.end], "decode_steps": args.steps,
                      "rounds": args.rounds, "capture_ms_per_step": round(c, 4),
                      "no_capture_ms_per_step": round(r, 4), "ratio": round(c / r, 4)}))


if __name__ == "__main__":
    main()
