"""Prefix KV snapshots: TTFT of a second session sharing a 1,000-token system prompt.

A loopback swarm of Qwen2.5-Coder 0.5B (0:8, 8:16, 16:24; 1 thread each). Session 1 sends a
~1,000-token system prompt plus question 1; session 2 the same system prompt plus question 2: its
hops restore the shared block prefix from the snapshots session 1 left and compute only the rest.
Then a fresh 8:16 peer joins while the first 8:16 peer is kept busy (its one session slot held by
another stream), so session 3 (question 2 again) routes through the fresh peer, which fetches the
prefix from the first 8:16 peer. Every answer is checked against llama.cpp's whole model (flash
attention on) greedy on the same full prompt. Prints one JSON object.

    python scripts/bench_prefix.py [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

from swarm import Client
from swarm.localswarm import PeerSet
from swarm.models import resolve_model
from swarm.numeric import UBATCH_TOKENS

SYSTEM = "".join(
    f"Rule {i}: when the user asks about topic {i}, answer politely, concisely and only with facts.\n"
    for i in range(48)
)
QUESTIONS = (
    "Question: what is the capital of France?\nAnswer:",
    "Question: name three prime numbers.\nAnswer:",
)


def serve(path: Path, layers: str, *extra: str) -> tuple[str, ...]:
    # 32,768 cells: 4,096 per session with the default 8 sessions (each has its own KV stream)
    return ("serve", "--model", str(path), "--layers", layers, "--threads", "1", "--cache-tokens", "32768",
            "--announce-period", "3", *extra)  # fmt: skip


def oracle(path: Path, prompt: str, n: int) -> str:
    # decode steps on 1 thread, as the numeric contract runs them (swarm/numeric.py)
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=1, n_threads_batch=2, n_ubatch=UBATCH_TOKENS,
                          flash_attn=True, verbose=False)
    try:
        return llm.create_completion(prompt, max_tokens=n, temperature=0.0)["choices"][0]["text"]
    finally:
        llm.close()


def run(client: Client, prompt: str, n: int) -> dict:
    t0 = time.perf_counter()
    g = client.generate(prompt, max_new_tokens=n)
    t = g.telemetry
    return {
        "ttft_ms": round(t.ttft_ms, 1),
        "wall_ms": round((time.perf_counter() - t0) * 1000, 1),
        "prompt_tokens": t.prompt_tokens,
        "reused_tokens": t.reused_tokens,
        "hops": [
            {"span": f"{h.start}:{h.end}", "reused": h.reused_tokens, "fetched_from": h.fetched_from[:12]}
            for h in t.route
        ],
        "tokens": g.text,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    path = resolve_model("qwen2.5-coder-0.5b", fetch=True)
    prompts = [SYSTEM + q for q in QUESTIONS]
    want = [oracle(path, p, args.tokens) for p in prompts]
    out: dict = {"model": "qwen2.5-coder-0.5b", "spans": ["0:8", "8:16", "16:24"]}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        ps = PeerSet(Path(tmp))
        try:
            first = ps.start("a", *serve(path, "0:8", "--new-swarm"))
            join = ("--initial-peers", first.maddrs[0])
            mid = ps.start("m1", *serve(path, "8:16", "--max-sessions", "1", *join))
            ps.start("z", *serve(path, "16:24", *join))
            with Client(str(path), initial_peers=first.maddrs) as client:
                s1 = run(client, prompts[0], args.tokens)
                s2 = run(client, prompts[1], args.tokens)
                out["session1"], out["session2"] = s1, s2
                out["ttft_ratio"] = round(s1["ttft_ms"] / s2["ttft_ms"], 2)
                out["exact"] = [s1.pop("tokens") == want[0], s2.pop("tokens") == want[1]]
                time.sleep(4)  # holdings records refresh
                held = client.stream("Hello", max_new_tokens=64)
                next(iter(held))  # holds m1's only session slot
                # as many sessions (KV streams) as m1: a snapshot imports only into the same layout
                fresh = ps.start("m2", *serve(path, "8:16", "--max-sessions", "1", *join))
                time.sleep(4)
                s3 = run(client, prompts[1], args.tokens)
                held.close()
                out["session3_fresh_peer"] = s3
                out["exact"].append(s3.pop("tokens") == want[1])
                out["fresh_peer_fetched_from_m1"] = any(
                    h["fetched_from"] and mid.peer_id.startswith(h["fetched_from"]) for h in s3["hops"]
                )
                out["fresh_peer"] = fresh.peer_id[:12]
        finally:
            ps.stop_all()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
