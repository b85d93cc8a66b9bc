"""What a peer pays to write a span file (`swarm.ggml_bridge.slicing.build_span`) for a span it has
not served before, per model, next to what parsing the header with `gguf.GGUFReader` alone costs
(the reader slicing used before it copied the vocabulary as raw bytes: every element of a 151k- or
262k-token vocabulary became a numpy view before a byte was written).

    flock /tmp/swarm-heavy.lock .venv/bin/python scripts/bench_span_build.py \
        [--models smollm2-135m qwen2.5-coder-0.5b gemma3-270m] [--repeats 3]

Prints one JSON object: per model, the median seconds of a first and a final span built into an
empty cache, and of `GGUFReader(path)`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf import GGUFReader  # noqa: E402 - the repo root is on sys.path now

from swarm.ggml_bridge.slicing import build_span, read_span_layers  # noqa: E402
from swarm.models import resolve_model  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(model: str, repeats: int) -> dict:
    path = resolve_model(model)
    _, n_layers = read_span_layers(path)
    half = n_layers // 2
    first, final, reader = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            first.append(timed(lambda: build_span(path, 0, half, cache_dir=Path(d))))
            final.append(timed(lambda: build_span(path, half, n_layers, cache_dir=Path(d))))
        reader.append(timed(lambda: GGUFReader(path, "r")))
    return {
        "n_layers": n_layers,
        "first_span_s": round(statistics.median(first), 3),
        "final_span_s": round(statistics.median(final), 3),
        "gguf_reader_parse_s": round(statistics.median(reader), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps({m: bench(m, args.repeats) for m in args.models}, indent=1))


if __name__ == "__main__":
    main()
