#!/usr/bin/env python
"""How much a decode step's logits depend on llama.cpp's thread count: the measurement behind the
numeric contract's "each generated token on 1 thread" (swarm/numeric.py).

For each model and prompt length (prompts cut from tests/data/contract_prompt.txt), the whole model
prefills the prompt (n_ubatch = UBATCH_TOKENS, flash attention on) and then decodes N greedy tokens,
once per thread setting, teacher-forced on the first setting's tokens. Settings are
(n_threads, n_threads_batch): llama.cpp runs a one-token ubatch on the first, a longer one on the
second. Prints one JSON object: per model and length, the largest |logit difference| of any decode
step and of the last prompt row against the first setting ("1/1").

Expected: "2/2" differs once the prompt passes 256 tokens (ggml's flash attention splits a one-row
query's KV cells across threads from a 512-cell view); "1/2" (the contract) equals "1/1" exactly,
because multi-row ubatches do not depend on the thread count.

Usage: scripts/numeric_threads.py [--models smollm2-135m qwen2.5-coder-0.5b gemma3-270m]
                                  [--lengths 200 300 600 1100] [--steps 48]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.models import resolve_model  # noqa: E402
from swarm.numeric import UBATCH_TOKENS  # noqa: E402

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "contract_prompt.txt"
SETTINGS = ((1, 1), (2, 2), (1, 2))


def _logits(llm) -> np.ndarray:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def run(llm, prompt: list[int], steps: int, threads: tuple[int, int], forced: list[int] | None):
    """(last prompt row's logits, [steps, n_vocab] decode logits, tokens fed) at `threads`."""
    import llama_cpp

    llama_cpp.llama_set_n_threads(llm.ctx, *threads)
    llm.reset()
    llm.eval(prompt)
    first = _logits(llm)
    rows, fed, last = [], [], first
    for i in range(steps):
        token = forced[i] if forced is not None else int(np.argmax(last))
        fed.append(token)
        llm.eval([token])
        last = _logits(llm)
        rows.append(last)
    return first, np.stack(rows), fed


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[200, 300, 600, 1100])
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    out: dict = {"ubatch": UBATCH_TOKENS, "steps": args.steps, "models": {}}
    text = TEXT.read_text()
    for name in args.models:
        path = resolve_model(name, fetch=True)
        llm = llama_cpp.Llama(str(path), n_ctx=2048, n_ubatch=UBATCH_TOKENS, n_threads=1, n_threads_batch=1,
                              flash_attn=True, verbose=False)
        ids = llm.tokenize(text.encode(), add_bos=True)
        per_len = {}
        for n in args.lengths:
            prompt = ids[:n]
            base_first, base_rows, fed = run(llm, prompt, args.steps, SETTINGS[0], None)
            row = {}
            for s in SETTINGS[1:]:
                first, rows, _ = run(llm, prompt, args.steps, s, fed)
                row[f"{s[0]}/{s[1]}"] = {
                    "prefill_max_abs": float(np.abs(first - base_first).max()),
                    "decode_max_abs": float(np.abs(rows - base_rows).max()),
                }
            per_len[str(n)] = row
        out["models"][name] = per_len
        llm.close()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
