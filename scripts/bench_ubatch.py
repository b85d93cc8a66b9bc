#!/usr/bin/env python
"""Prefill speed of llama.cpp's whole model per ubatch size: the measurement behind the ubatch grid.

Every path computes a prompt's rows in ubatches of `swarm.numeric.UBATCH_TOKENS` rows (the grid of
the numeric contract); a larger ubatch feeds the matmuls more rows at once but makes prefix reuse
coarser (a snapshot restores whole ubatches only). This prints one JSON object: prompt tokens/s per
ubatch size and model, the best of several runs (runs alternate between sizes, so background load
spreads over all of them), with 2 threads and flash attention, as the peers run.

Usage: scripts/bench_ubatch.py [--models smollm2-135m qwen2.5-coder-0.5b] [--ubatch 64 128 256 512]
                               [--prompt-tokens 1024] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.models import resolve_model  # noqa: E402


def prefill_s(llm, prompt: list[int]) -> float:
    """Seconds to evaluate `prompt` from position 0 (logits of the last row only)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    return time.perf_counter() - t0


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--ubatch", nargs="+", type=int, default=[64, 128, 256, 512])
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    out: dict = {"prompt_tokens": args.prompt_tokens, "threads": args.threads, "models": {}}
    for name in args.models:
        path = str(resolve_model(name))
        llms = {
            g: llama_cpp.Llama(path, n_ctx=args.prompt_tokens + 64, n_batch=max(args.ubatch), n_ubatch=g,
                               n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True,
                               verbose=False)
            for g in args.ubatch
        }
        prompt = [int(t) for t in rng.integers(100, min(llm.n_vocab() for llm in llms.values()),
                                               size=args.prompt_tokens)]
        best = {g: float("inf") for g in args.ubatch}
        prefill_s(llms[args.ubatch[0]], prompt[:64])  # warm the weights' pages
        for _ in range(args.repeats):
            for g, llm in llms.items():
                best[g] = min(best[g], prefill_s(llm, prompt))
        out["models"][name] = {str(g): round(args.prompt_tokens / s, 1) for g, s in best.items()}
        for llm in llms.values():
            llm.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
