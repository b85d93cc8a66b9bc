"""Batching decode steps across sessions, and fair prefill, on one span holding a whole model.

Three measurements, each side by side in one run, printed as one JSON object:

  rows:    ms of one llama_decode of 1, 2, 4 and 8 decode rows (one per sequence): the most batching
           can buy on this CPU;
  batch:   N concurrent greedy sessions vs one session alone.
           (a) the span's StepScheduler in this process (no network), batch caps 1 (no batching),
               the probed exact cap, and N (inexact where the probe says so): aggregate decode
               tokens/s, and whether every session's tokens equal its solo run;
           (b) one real `swarm serve` peer and a Client: 1 session, then N concurrent sessions
               (one thread each): aggregate decode tokens/s and token identity with the solo runs.
  prefill: session B decodes while session A prefills a long prompt through the same scheduler;
           B's worst gap between tokens vs its normal step time plus the prefill's slowest chunk
           (chunks near the end attend to the whole prompt, so they cost more than the first), with
           chunks of 64 rows (this peer) and of 256 rows (the client's frame size, which one C call
           ran whole before the scheduler).

    python scripts/bench_batching.py [--model qwen2.5-coder-0.5b] [--sessions 8] [--decode 32]
                                     [--prefill-tokens 4000] [--skip-peer] [--skip-prefill] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from swarm import Client
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.executor import BatchStep, SpanExecutor
from swarm.ggml_bridge.slicing import read_span_layers
from swarm.models import resolve_model
from swarm.peer.exact_rows import exact_batch_cap
from swarm.peer.scheduler import StepScheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.bench_swarm import machine  # noqa: E402
from tests.helpers.peers import PeerSet  # noqa: E402 - the tests' peer launcher: real `swarm serve` processes

BLOCK = 64
PROMPTS = [
    "def quicksort(xs):",
    "The capital of France is",
    "Write a haiku about the sea.",
    "import numpy as np\n\ndef softmax(x):",
    "Once upon a time, in a small village,",
    "SELECT name, age FROM users WHERE",
    "The three laws of thermodynamics are",
    "fn main() {\n    let v = vec![1, 2, 3];",
]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def open_whole(path: Path, n_seq: int, n_ctx: int, threads: int = 1) -> SpanExecutor:
    """The whole model as one span; `threads` run its multi-row ubatches (prefill chunks, batches of
    decode steps), while a lone decode step runs on 1 thread (the numeric contract)."""
    _, n_layers = read_span_layers(path)
    return SpanExecutor.for_span(path, 0, n_layers, n_ctx_tokens=n_ctx, n_seq_max=n_seq, n_threads=threads,
                                 n_batch=BLOCK)


async def _session(sch: StepScheduler, emb: TokenEmbedder, seq: int, ids: list[int], n: int, marks=None):
    """Greedy: prefill then n decode steps; returns the tokens (and appends decode-step end times)."""
    logits = (await sch.step(seq, 0, emb.embed(ids))).out[-1]
    toks = [int(np.argmax(logits))]
    for i in range(n):
        logits = (await sch.step(seq, len(ids) + i, emb.embed([toks[-1]]))).out[0]
        toks.append(int(np.argmax(logits)))
        if marks is not None:
            marks.append(time.perf_counter())
    return toks


def bench_scheduler(path: Path, prompts: list[list[int]], n_decode: int, threads: int = 1) -> dict:
    """Aggregate decode tokens/s of len(prompts) concurrent sessions per batch cap, vs one alone."""
    emb, n = TokenEmbedder(path), len(prompts)
    ex = open_whole(path, n, 4096, threads)
    out: dict = {"sessions": n, "decode_steps": n_decode, "threads": threads, "loadavg_start": loadavg()}
    try:
        exact = exact_batch_cap(ex)
        out["probed_exact_cap"] = exact
        with ThreadPoolExecutor(1) as pool:
            solo, solo_rate = [], []
            for p in prompts:
                sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK)
                marks: list[float] = []
                solo.append(asyncio.run(_session(sch, emb, 0, p, n_decode, marks)))
                solo_rate.append((len(marks) - 1) / (marks[-1] - marks[0]))
                ex.clear(0)
            out["solo_decode_tok_s"] = round(float(np.median(solo_rate)), 2)
            for cap in sorted({1, exact, n}):
                sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=BLOCK, max_batch_rows=cap)
                marks = []

                async def main(sch=sch, marks=marks):
                    return await asyncio.gather(
                        *(_session(sch, emb, i, p, n_decode, marks) for i, p in enumerate(prompts)))

                got = asyncio.run(main())
                for i in range(n):
                    ex.clear(i)
                # Rate over the window where every session was decoding (all prefills done).
                marks.sort()
                tail = marks[n - 1 :]
                rate = (len(tail) - 1) / (tail[-1] - tail[0])
                batches = [r for k, _, r in sch.units if k == "batch"]
                out[f"cap_{cap}"] = {
                    "aggregate_decode_tok_s": round(rate, 2),
                    "x_solo": round(rate / out["solo_decode_tok_s"], 2),
                    "mean_batch_rows": round(float(np.mean(batches)), 2),
                    "sessions_equal_solo": sum(g == s for g, s in zip(got, solo)),
                }
    finally:
        ex.close()
    out["loadavg_end"] = loadavg()
    return out


def bench_rows(path: Path, threads: int, repeats: int = 20) -> dict:
    """ms of one llama_decode of n decode rows, one per sequence (each sequence holding 32 positions),
    median of `repeats`, for n = 1, 2, 4, 8; and the rows/s of each as a multiple of one row's. What
    batching can buy at most on this CPU: where a batch of n rows costs n single rows, nothing."""
    emb = TokenEmbedder(path)
    ex = open_whole(path, 8, 8 * 512, threads)
    try:
        prompt = emb.embed(list(range(100, 132)))
        for seq in range(8):
            ex.forward(seq, 0, prompt)
        x, ms = emb.embed([42]), {}
        for n in (1, 2, 4, 8):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                if n == 1:
                    ex.forward(0, 32, x)
                else:
                    ex.forward_batch([BatchStep(seq, 32, x) for seq in range(n)])
                times.append((time.perf_counter() - t0) * 1000)
                for seq in range(n):
                    ex.truncate(seq, 32)
            ms[n] = float(np.median(times))
    finally:
        ex.close()
    return {"threads": threads, "batch_ms": {n: round(v, 2) for n, v in ms.items()},
            "rows_per_s_x_one_row": {n: round(n * ms[1] / v, 2) for n, v in ms.items()}}


def bench_peer(path: Path, n: int, n_decode: int, root: Path, threads: int = 1) -> dict:
    """One `swarm serve` peer with the whole model (`--threads threads`); 1 session, then n
    concurrent sessions."""
    ps = PeerSet(root)
    out: dict = {"threads": threads, "loadavg_start": loadavg()}
    try:
        _, n_layers = read_span_layers(path)
        peer = ps.start("p0", "serve", "--model", str(path), "--layers", f"0:{n_layers}",
                        "--threads", str(threads),
                        "--cache-tokens", "4096", "--max-sessions", str(n), "--client-sessions", str(n),
                        "--new-swarm")
        with Client(str(path), initial_peers=peer.maddrs) as client:
            client.generate(PROMPTS[0], max_new_tokens=4)  # warm-up: connections, RTT probes
            solo, t_solo = [], []
            for p in PROMPTS[:n]:
                t0 = time.perf_counter()
                g = client.generate(p, max_new_tokens=n_decode)
                t_solo.append(time.perf_counter() - t0)
                solo.append(g.tokens)
            together: list = [None] * n

            def run(i: int) -> None:
                together[i] = client.generate(PROMPTS[i], max_new_tokens=n_decode).tokens

            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        one = n_decode / float(np.median(t_solo))
        out.update({
            "tokens_per_session": n_decode,
            "solo_tok_s": round(one, 2),
            "concurrent_aggregate_tok_s": round(n * n_decode / wall, 2),
            "x_solo": round(n * n_decode / wall / one, 2),
            "sessions_equal_solo": sum(a == b for a, b in zip(together, solo)),
            "loadavg_end": loadavg(),
        })
    finally:
        ps.stop_all()
    return out


def bench_prefill(path: Path, n_prefill: int, n_decode: int) -> dict:
    """Session B decodes while A prefills n_prefill rows; B's worst gap per chunk size."""
    emb = TokenEmbedder(path)
    ex = open_whole(path, 2, 2 * (n_prefill + 512))  # each of the 2 sequences has its own KV stream
    rng = np.random.default_rng(0)
    long_ids = [int(t) for t in rng.integers(100, 20_000, size=n_prefill)]
    b_ids = [int(t) for t in rng.integers(100, 20_000, size=16)]
    out: dict = {"prefill_tokens": n_prefill, "loadavg_start": loadavg()}
    try:
        chunk_ms = []
        for _ in range(4):  # the first call warms up and is dropped
            t0 = time.perf_counter()
            ex.forward(0, 0, emb.embed(long_ids[:BLOCK]))
            chunk_ms.append((time.perf_counter() - t0) * 1000)
            ex.clear(0)
        out["one_64_row_chunk_ms"] = round(float(np.median(chunk_ms[1:])), 1)
        with ThreadPoolExecutor(1) as pool:
            for chunk in (BLOCK, 4 * BLOCK):
                sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=chunk)

                async def main(sch=sch):
                    alone: list[float] = []
                    await _session(sch, emb, 1, b_ids, 8, alone)
                    ex.clear(1)
                    marks: list[float] = []
                    b = asyncio.ensure_future(_session(sch, emb, 1, b_ids, 10_000, marks))
                    await asyncio.sleep(0.5)  # bench only: let B reach steady decoding first
                    t0 = time.perf_counter()
                    await sch.step(0, 0, emb.embed(long_ids))
                    t1 = time.perf_counter()
                    b.cancel()
                    gaps = np.diff([m for m in marks if t0 - 1.0 <= m <= t1 + 0.2]) * 1000
                    return float(np.median(np.diff(alone)) * 1000), float(gaps.max()), (t1 - t0)

                step_ms, worst_ms, prefill_s = asyncio.run(main())
                chunk_ms = [ms for (k, seqs, _), ms in zip(sch.units, sch.unit_ms)
                            if k == "chunk" and seqs == (0,)]
                ex.clear(0)
                ex.clear(1)
                out[f"chunk_{chunk}"] = {
                    "b_step_ms_alone": round(step_ms, 1),
                    "b_worst_gap_ms": round(worst_ms, 1),
                    "a_chunk_ms_first_last_max": [round(chunk_ms[0], 1), round(chunk_ms[-1], 1),
                                                  round(max(chunk_ms), 1)],
                    "bound_2x_step_plus_max_chunk_ms": round(2 * step_ms + max(chunk_ms), 1),
                    "a_prefill_s": round(prefill_s, 2),
                }
    finally:
        ex.close()
    out["loadavg_end"] = loadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill-tokens", type=int, default=4000)
    ap.add_argument("--skip-peer", action="store_true", help="only the in-process measurements")
    ap.add_argument("--skip-prefill", action="store_true", help="only the batching measurements")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of the span's multi-row ubatches (batches, prefill); a lone decode step "
                         "runs on 1 thread whatever this is (the numeric contract)")
    args = ap.parse_args()
    path = resolve_model(args.model)
    from swarm.client.tokenizer import Tokenizer  # noqa: PLC0415 - only for the prompts

    tok = Tokenizer.from_gguf(path)
    prompts = [tok.encode(p) for p in PROMPTS[: args.sessions]]
    out = {"model": args.model, **machine()}
    out["rows"] = bench_rows(path, args.threads)
    out["scheduler"] = bench_scheduler(path, prompts, args.decode, args.threads)
    if not args.skip_prefill:
        out["prefill"] = bench_prefill(path, args.prefill_tokens, args.decode)
    if not args.skip_peer:
        with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
            out["peer"] = bench_peer(path, args.sessions, args.decode, Path(tmp), args.threads)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
