"""What exact failover replay costs: a replacement hop computing a failed hop's recorded steps as
they were first computed (`Forward.steps`: a prompt step, then one-row decode steps) vs the same
rows regrouped into one frame (the peer then runs them in 64-row chunks, which llama.cpp rounds
differently: not exact).

One middle span per model (SmolLM2 [10, 20), Qwen2.5 0.5B [8, 16)), 1 thread, the peer's step
scheduler in this process; rows: a 38-row prompt step plus `--decode` one-row steps of random
hidden states. Prints one JSON object: per model, ms for each way, their ratio, and the max
difference of the regrouped output from the exact one.

    .venv/bin/python scripts/bench_replay.py [--decode 120] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from swarm.ggml_bridge.executor import SpanExecutor
from swarm.models import resolve_model
from swarm.peer.scheduler import StepScheduler

SPANS = {"smollm2-135m": (10, 20), "qwen2.5-coder-0.5b": (8, 16)}
PROMPT_ROWS = 38
CHUNK = 64  # a peer's n_batch: multi-row steps run in chunks of this many rows


def replay_ms(ex: SpanExecutor, rows: np.ndarray, steps: tuple[int, ...]) -> tuple[float, np.ndarray]:
    """ms to run `rows` as `steps` on a fresh sequence through the scheduler, and the output."""

    async def main():
        with ThreadPoolExecutor(1) as pool:
            sch = StepScheduler(lambda: ex, asyncio.Lock(), pool, chunk_tokens=CHUNK)
            t0 = time.perf_counter()
            r = await sch.step(0, 0, rows, steps=steps)
            return (time.perf_counter() - t0) * 1000.0, r.out

    try:
        return asyncio.run(main())
    finally:
        ex.clear(0)


def bench(model: str, n_decode: int, repeats: int, cache: Path) -> dict:
    start, end = SPANS[model]
    ex = SpanExecutor.for_span(resolve_model(model), start, end, n_ctx_tokens=2048, n_seq_max=1,
                               n_threads=1, cache_dir=cache, n_batch=CHUNK)
    try:
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((PROMPT_ROWS + n_decode, ex.n_embd)).astype(np.float32)
        exact_steps = (PROMPT_ROWS,) + (1,) * n_decode
        exact, regrouped, diff = [], [], 0.0
        for _ in range(repeats):  # alternate, so both ways see the same machine load
            ms, out_exact = replay_ms(ex, rows, exact_steps)
            exact.append(ms)
            ms, out_regrouped = replay_ms(ex, rows, ())
            regrouped.append(ms)
            diff = max(diff, float(np.abs(out_regrouped - out_exact).max()))
    finally:
        ex.close()
    e, r = statistics.median(exact), statistics.median(regrouped)
    return {"span": [start, end], "rows": int(rows.shape[0]), "exact_ms": round(e, 1),
            "regrouped_ms": round(r, 1), "exact_over_regrouped": round(e / r, 2),
            "regrouped_max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", type=int, default=120, help="one-row decode steps after the prompt step")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        out = {m: bench(m, args.decode, args.repeats, Path(tmp)) for m in SPANS}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
