"""The OpenAI-compatible API's overhead over the Python client, on one 3-peer loopback swarm.

Starts a swarm of SmolLM2 (or --model) on 127.0.0.1, three `swarm serve` peers with equal thirds of
the layers, and a `swarm api` process in front of it. Then, for 1 and for 8 concurrent streams, the
same greedy requests (different prompts, --max-tokens tokens each) go (a) through `swarm.Client`
in this process (threads), (b) through the official `openai` client to `swarm api` (streamed, one
HTTP connection per stream). One run of each, after one warm-up request each.

Per stream: TTFT (request start to the first text), decode tokens/s (tokens after the first, per
second from the first to the last text). Reported: mean TTFT, mean per-stream tokens/s, total
tokens/s over the burst, and the API's overhead (api - client TTFT in ms; api / client tokens/s).
Prints one JSON object.

    python scripts/bench_api.py [--model smollm2-135m] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from swarm import Client
from swarm.localswarm import even_spans
from swarm.manifest import build_manifest
from swarm.models import resolve_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.peers import PeerSet, serve_args, wait_for  # noqa: E402 - the tests' peer launcher

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "The three most important inventions of the twentieth century are",
    "Once upon a time, in a small village,",
    "The best way to learn a new language is",
    "import numpy as np\n",
    "Water boils at a temperature of",
]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def run_client(client: Client, prompt: str, n: int) -> tuple[float, float, int]:
    """(ttft_s, last_s, tokens) of one streamed generation through the Python client."""
    t0 = time.perf_counter()
    first = last = None
    stream = client.stream(prompt, max_new_tokens=n)
    for _ in stream:
        last = time.perf_counter()
        first = first or last
    return first - t0, last - t0, len(stream.result.tokens)


def run_api(api: openai.OpenAI, model: str, prompt: str, n: int) -> tuple[float, float, int]:
    """(ttft_s, last_s, tokens) of one streamed completion through the API."""
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    stream = api.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first - t0, last - t0, tokens


def burst(fn, n_streams: int) -> dict:
    """Run fn(prompt) on n_streams threads at once; summarise TTFT and tokens/s."""
    results: list[tuple[float, float, int]] = [None] * n_streams  # type: ignore[list-item]

    def one(i: int) -> None:
        results[i] = fn(PROMPTS[i % len(PROMPTS)])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    per_stream = [(k - 1) / (last - ttft) for ttft, last, k in results if k > 1 and last > ttft]
    return {
        "ttft_ms_mean": round(1000 * sum(r[0] for r in results) / n_streams, 1),
        "tokens_per_s_per_stream": round(sum(per_stream) / len(per_stream), 2),
        "tokens_per_s_total": round(sum(r[2] for r in results) / wall, 2),
        "tokens": sum(r[2] for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    path = resolve_model(args.model)
    n_layers = build_manifest(path).n_layers
    out: dict = {"model": args.model, "max_tokens": args.max_tokens, "loadavg_before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        ps = PeerSet(Path(tmp))
        api_proc = None
        try:
            join: tuple[str, ...] = ()
            for i, (a, b) in enumerate(even_spans(n_layers, 3)):
                first = ("--new-swarm",) if i == 0 else join
                p = ps.start(f"p{i}", *serve_args(path, f"{a}:{b}", *first, "--max-sessions", "16",
                                                         "--client-sessions", "16"))
                join = join or ("--initial-peers", p.maddrs[0])
            err = Path(tmp) / "api.log"
            api_proc = subprocess.Popen(
                [sys.executable, "-m", "swarm.cli", "api", "--model", str(path), *join, "--port", "0"],
                stderr=open(err, "w"),
                stdout=subprocess.DEVNULL,
            )

            def url() -> str | None:
                found = re.search(r"OpenAI API at (http://\S+/v1),", err.read_text())
                return found and found.group(1)

            base = wait_for(url, "swarm api is ready", 180)
            api = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
            model = api.models.list().data[0].id
            with Client(str(path), initial_peers=[join[1]]) as client:
                run_client(client, PROMPTS[0], 4)  # warm-up: DHT read, pings, first route
                run_api(api, model, PROMPTS[0], 4)
                for n_streams in (1, 8):
                    c = burst(lambda p: run_client(client, p, args.max_tokens), n_streams)
                    a = burst(lambda p: run_api(api, model, p, args.max_tokens), n_streams)
                    out[f"{n_streams}_streams"] = {
                        "python_client": c,
                        "api": a,
                        "api_overhead": {
                            "ttft_ms": round(a["ttft_ms_mean"] - c["ttft_ms_mean"], 1),
                            "tokens_per_s_ratio": round(
                                a["tokens_per_s_per_stream"] / c["tokens_per_s_per_stream"], 3
                            ),
                        },
                    }
        finally:
            if api_proc is not None and api_proc.poll() is None:
                api_proc.send_signal(signal.SIGTERM)
                api_proc.wait(60)
            ps.stop_all()
    out["loadavg_after"] = loadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
