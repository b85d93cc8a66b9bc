"""Draft quality without a swarm: how many of a draft's guesses the target's greedy text keeps, and
what the draft costs, per self-draft type (swarm/client/draftmodel.py) and for prompt lookup.

The target's greedy text is decoded once locally (`Client(local=True)`); then, as a generation with
k drafted tokens per pass would, each draft proposes k tokens after the text so far, keeps the ones
that match the target's text up to the first miss, and moves on by the kept ones plus one. That is
exactly a fixed-k speculative run's acceptance (the target's tokens are the same), without the
route's time. Draft time is the wall time of `propose` per proposed token (catching up on the kept
tokens included), on this machine's cores, next to the target's own local decode time per token.

    flock /tmp/swarm-heavy.lock .venv/bin/python scripts/bench_draft.py [--model smollm2-135m] \
        [--types Q2_K Q3_K_M Q4_0] [--k 4] [--decode 128] [--threads 1]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm.manifest import build_manifest  # noqa: E402 - the repo root is on sys.path now
from swarm.models import resolve_model  # noqa: E402
from tests.helpers.oracle import PROMPT as CODE  # noqa: E402

TASKS = {
    "copy": (CODE + "        self.items = []\n\n# The same code, copied exactly:\n"
             + CODE.split("\n", 1)[0] + "\n"),
    "novel": ("Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
              "Once upon a time,"),
}


def walk(draft, prompt: list[int], text: list[int], k: int) -> dict:
    """A fixed-k speculative run over the target's greedy `text`: acceptance, tokens per pass and
    the draft's ms per proposed token."""
    pos, passes, drafted, kept, draft_s = 0, 0, 0, 0, 0.0
    while pos + 1 < len(text):
        budget = min(k, len(text) - pos - 1)
        t0 = time.perf_counter()
        guess = draft.propose(prompt + text[: pos + 1], budget)[:budget]
        draft_s += time.perf_counter() - t0
        if not guess:
            pos += 1  # a plain step
            continue
        a = 0
        while a < len(guess) and guess[a] == text[pos + 1 + a]:
            a += 1
        passes, drafted, kept = passes + 1, drafted + len(guess), kept + a
        pos += a + 1
    return {
        "acceptance": round(kept / drafted, 3) if drafted else 0.0,
        "tokens_per_pass": round((kept + passes) / passes, 2) if passes else 0.0,
        "passes": passes,
        "draft_ms_per_token": round(1000.0 * draft_s / drafted, 2) if drafted else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--types", nargs="+", default=["Q2_K", "Q3_K_M", "Q4_0"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="the draft's llama.cpp threads")
    args = ap.parse_args()

    from swarm import Client
    from swarm.client.draftmodel import DraftWeights, self_draft
    from swarm.spec.draft import PromptLookup

    path = resolve_model(args.model, fetch=True)
    model_id = build_manifest(path).model_id
    with Client(str(path), local=True, n_threads=args.threads) as target:
        texts = {}
        for task, prompt in TASKS.items():
            g = target.generate(prompt, max_new_tokens=args.decode)
            texts[task] = (target.tokenizer.encode(prompt), g.tokens,
                           round(1000.0 / g.telemetry.decode_tokens_per_s, 2))
    rows = []
    for task, (prompt, text, target_ms) in texts.items():
        rows.append({"task": task, "draft": "lookup", "target_ms_per_token": target_ms,
                     **walk(PromptLookup(), prompt, text, args.k)})
    for qtype in args.types:
        t0 = time.perf_counter()
        draft_path = self_draft(path, model_id, qtype)
        made_s = time.perf_counter() - t0
        weights = DraftWeights(draft_path, n_threads=args.threads)
        for task, (prompt, text, target_ms) in texts.items():
            d = weights.draft(len(prompt) + len(text) + args.k)
            try:
                rows.append({"task": task, "draft": f"self:{qtype}", "target_ms_per_token": target_ms,
                             "draft_mib": round(draft_path.stat().st_size / 2**20, 1),
                             "made_or_cached_s": round(made_s, 1), **walk(d, prompt, text, args.k)})
            finally:
                d.close()
    print(json.dumps({"model": args.model, "k": args.k, "decode": args.decode, "threads": args.threads,
                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
