#!/usr/bin/env python
"""Span chain vs llama.cpp's whole model in one process: prefill tokens/s, decode ms/token, RSS.

Prints one JSON object. Both sides use the same llama.cpp, threads and flash-attention setting;
the chain is TokenEmbedder -> SpanExecutor per span -> last-span logits, greedy decode. Runs
alternate (chain, whole, chain, whole, ...) and the best of each side is reported, since other
processes on a small machine make single runs noisy (llama.cpp's OpenMP threads spin-wait).

Usage: scripts/bench_executor.py [--model qwen2.5-coder-0.5b] [--spans 3] [--threads 2]
                                 [--prompt-tokens 128] [--decode-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.ggml_bridge.embed import TokenEmbedder  # noqa: E402
from swarm.ggml_bridge.executor import SpanExecutor  # noqa: E402
from swarm.ggml_bridge.slicing import read_span_layers  # noqa: E402
from swarm.models import resolve_model  # noqa: E402


def rss_mib() -> float:
    """Current resident set size of this process in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def bench_whole(path: Path, prompt: list[int], n_decode: int, threads: int) -> dict:
    import llama_cpp

    before = rss_mib()
    llm = llama_cpp.Llama(str(path), n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                          flash_attn=True, verbose=False)
    try:
        t0 = time.perf_counter()
        llm.eval(prompt)
        prefill_s = time.perf_counter() - t0
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([nxt])
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        decode_s = time.perf_counter() - t0
        rss = rss_mib() - before
    finally:
        llm.close()
    return {"prefill_tok_s": len(prompt) / prefill_s, "decode_ms_per_token": 1e3 * decode_s / n_decode,
            "rss_mib": rss}


def bench_chain(path: Path, bounds: list[int], prompt: list[int], n_decode: int, threads: int,
                cache: Path) -> dict:
    embedder = TokenEmbedder(path)
    chain, rss = [], []
    for a, b in zip(bounds, bounds[1:]):
        before = rss_mib()
        ex = SpanExecutor.for_span(path, a, b, n_ctx_tokens=1024, n_seq_max=1, n_threads=threads,
                                   cache_dir=cache)
        ex.forward(0, 0, np.zeros((8, ex.n_embd), np.float32))  # touch the weights
        ex.clear(0)
        chain.append(ex)
        rss.append(rss_mib() - before)

    def step(ids: list[int], pos: int) -> np.ndarray:
        h = embedder.embed(ids)
        for ex in chain[:-1]:
            h = ex.forward(0, pos, h)
        return chain[-1].forward(0, pos, h)

    try:
        t0 = time.perf_counter()
        logits = step(prompt, 0)
        prefill_s = time.perf_counter() - t0
        pos = len(prompt)
        t0 = time.perf_counter()
        for _ in range(n_decode):
            logits = step([int(np.argmax(logits[0]))], pos)
            pos += 1
        decode_s = time.perf_counter() - t0
    finally:
        for ex in chain:
            ex.close()
    return {"spans": [[a, b] for a, b in zip(bounds, bounds[1:])], "prefill_tok_s": len(prompt) / prefill_s,
            "decode_ms_per_token": 1e3 * decode_s / n_decode, "rss_mib_per_span": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--spans", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="alternate chain/whole runs; best of each is kept")
    args = ap.parse_args()

    path = resolve_model(args.model, fetch=False)
    _, n_layers = read_span_layers(path)
    bounds = [round(i * n_layers / args.spans) for i in range(args.spans + 1)]
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 10_000, size=args.prompt_tokens)]
    chains, wholes = [], []
    with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
        for _ in range(args.repeats):  # alternate, so load from other processes hits both sides alike
            chains.append(bench_chain(path, bounds, prompt, args.decode_tokens, args.threads, Path(tmp)))
            wholes.append(bench_whole(path, prompt, args.decode_tokens, args.threads))
    chain = min(chains, key=lambda r: r["decode_ms_per_token"])
    chain["prefill_tok_s"] = max(r["prefill_tok_s"] for r in chains)
    whole = min(wholes, key=lambda r: r["decode_ms_per_token"])
    whole["prefill_tok_s"] = max(r["prefill_tok_s"] for r in wholes)
    print(json.dumps({
        "model": args.model,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "repeats": args.repeats,
        "whole": whole,
        "chain": chain,
        "decode_ratio_chain_over_whole": chain["decode_ms_per_token"] / whole["decode_ms_per_token"],
        "prefill_ratio_whole_over_chain": whole["prefill_tok_s"] / chain["prefill_tok_s"],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_avg_1m": os.getloadavg()[0],
    }, indent=2))


if __name__ == "__main__":
    main()
