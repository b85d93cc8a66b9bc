"""Swarm vs whole model: decode speed, TTFT and per-hop protocol overhead on one machine.

Side by side, same model, greedy, a ~128-token prompt and 64 decode steps:
  (a) llama.cpp's whole model in this process (llama_cpp.Llama), 1 and 2 threads;
  (b) a 3-peer loopback swarm (three `swarm serve` processes, equal thirds of the layers) and a
      client, for each peer setting: 1 thread; 2 threads; 2 threads with GOMP_SPINCOUNT=1000.
For the swarm, protocol overhead per decode step = the client's step time minus the sum of the
hops' reported compute_ms (telemetry), in ms, p50/p90; per hop = that divided by the hop count.
Ratios are swarm / whole model at the same thread count. Prints one JSON object.

    python scripts/bench_swarm.py [--model qwen2.5-coder-0.5b] [--decode 64] [--prompt-tokens 128]

Starts and stops its own peers (in a temporary directory); the load average is sampled around
each measurement because other work on the machine skews every number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

from swarm import Client
from swarm.manifest import build_manifest
from swarm.models import resolve_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.cpu_variants import loaded_variant  # noqa: E402
from tests.helpers.peers import PeerSet  # noqa: E402 - the tests' peer launcher: real `swarm serve` processes

TEXT = (
    "The history of computing is a story of people, machines and ideas. Early mechanical calculators "
    "gave way to electronic computers, which in turn became smaller, faster and cheaper every year. "
)
SWARM_CONFIGS = (("1 thread", 1, None), ("2 threads", 2, None), ("2 threads, GOMP_SPINCOUNT=1000", 2, "1000"))


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def machine() -> dict:
    """What the figures were measured on: the CPU's model name, its core count, the ggml CPU
    variant loaded (setup builds haswell and alderlake, README "The numeric contract") and that
    backend's CPU features (`llama_print_system_info`)."""
    llama_cpp.llama_backend_init()  # loads the CPU variant (idempotent)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    return {"cpu": cpu, "cpus": os.cpu_count(), "ggml_cpu_variant": loaded_variant(),
            "ggml": llama_cpp.llama_print_system_info().decode().strip()}


def make_prompt(llm: llama_cpp.Llama, n_tokens: int) -> str:
    """A plain-text prompt of about n_tokens tokens (cut on a token boundary)."""
    toks = llm.tokenize((TEXT * (n_tokens // 20 + 2)).encode(), add_bos=False)
    return llm.detokenize(toks[:n_tokens]).decode(errors="ignore")


def thread_label(threads: int) -> str:
    return f"{threads} thread{'s' * (threads > 1)}"


def pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 3) if xs else float("nan")


def bench_whole(path: Path, prompt: str, n_decode: int, threads: int, repeats: int) -> dict:
    """llama.cpp whole model, greedy by argmax over the last logits (no Python sampler chain):
    TTFT = prompt eval + first token; decode tokens/s over n_decode one-token evals. Best of `repeats`."""
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=1024,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        flash_attn=True,
        verbose=False,
    )
    tokens = llm.tokenize(prompt.encode())
    runs = []
    for _ in range(repeats + 1):  # the first run warms up and is dropped
        llm.reset()
        load0 = loadavg()
        t0 = time.perf_counter()
        llm.eval(tokens)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t1 = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t2 = time.perf_counter()
        runs.append(
            {
                "threads": threads,
                "prompt_tokens": len(tokens),
                "ttft_ms": round((t1 - t0) * 1000, 2),
                "decode_tokens": n_decode,
                "decode_tok_s": round(n_decode / (t2 - t1), 2),
                "loadavg_before": load0,
                "loadavg_after": loadavg(),
            }
        )
    del llm
    return max(runs[1:], key=lambda r: r["decode_tok_s"])


def start_swarm(root: Path, path: Path, n_layers: int, threads: int, spincount: str | None) -> PeerSet:
    """Three `swarm serve` peers on 127.0.0.1 for equal thirds of the layers."""
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    ps = PeerSet(root)
    old = os.environ.pop("GOMP_SPINCOUNT", None)
    if spincount is not None:
        os.environ["GOMP_SPINCOUNT"] = spincount  # inherited by the peer processes started below
    try:
        for i in range(3):
            join = ("--new-swarm",) if i == 0 else ("--initial-peers", ps.started[0].maddrs[0])
            ps.start(
                f"p{i}",
                "serve",
                "--model",
                str(path),
                "--layers",
                f"{cuts[i]}:{cuts[i + 1]}",
                "--threads",
                str(threads),
                "--cache-tokens",
                "16384",  # 2,048 per session (8 sessions, each with its own KV stream)
                *join,
            )
    except BaseException:
        ps.stop_all()
        raise
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)
        if old is not None:
            os.environ["GOMP_SPINCOUNT"] = old
    return ps


def bench_swarm(path: Path, prompt: str, n_decode: int, ps: PeerSet, repeats: int) -> dict:
    """Client generations through the 3 peers; per-step wall time vs the hops' compute_ms. Best of
    `repeats` by decode tokens/s."""
    with Client(str(path), initial_peers=ps.started[0].maddrs) as client:
        client.generate(prompt[:40], max_new_tokens=4)  # warm-up: RTT probes, connections, caches
        runs = [_swarm_run(client, prompt, n_decode) for _ in range(repeats)]
    return max(runs, key=lambda r: r["decode_tok_s"])


def _swarm_run(client: Client, prompt: str, n_decode: int) -> dict:
    """One measured generation: TTFT, decode tokens/s, per-step wall time and overhead."""
    load0 = loadavg()
    stream = client.stream(prompt, max_new_tokens=n_decode + 1)
    tel = stream.telemetry
    overhead, steps, prev_t, prev_c, prev_n = [], [], None, 0.0, 0
    for _ in stream:
        now, comp, n = time.perf_counter(), sum(h.compute_ms for h in tel.route), len(tel.token_latencies_ms)
        if prev_t is not None and n - prev_n == 1:  # one decode step between these two deltas
            steps.append((now - prev_t) * 1000.0)
            overhead.append(steps[-1] - (comp - prev_c))
        prev_t, prev_c, prev_n = now, comp, n
    n_hops = len(tel.route)
    return {
        "prompt_tokens": tel.prompt_tokens,
        "ttft_ms": round(tel.ttft_ms, 2),
        "decode_tokens": tel.generated_tokens - 1,
        "decode_tok_s": round(tel.decode_tokens_per_s, 2),
        "hops": [[h.start, h.end] for h in tel.route],
        "transports": [h.transport for h in tel.route],
        "pushed_steps": [h.pushed_steps for h in tel.route],
        "step_ms_p50": pct(steps, 50),
        "step_ms_p90": pct(steps, 90),
        "overhead_per_step_ms_p50": pct(overhead, 50),
        "overhead_per_step_ms_p90": pct(overhead, 90),
        "overhead_per_hop_ms_p50": pct([o / n_hops for o in overhead], 50),
        "overhead_per_hop_ms_p90": pct([o / n_hops for o in overhead], 90),
        "compute_ms_per_hop_total": [round(h.compute_ms, 1) for h in tel.route],
        "loadavg_before": load0,
        "loadavg_after": loadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--decode", type=int, default=64, help="decode steps")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per setting; the best is kept")
    args = ap.parse_args()
    path = resolve_model(args.model)
    n_layers = build_manifest(path).n_layers
    tok = llama_cpp.Llama(model_path=str(path), n_ctx=256, vocab_only=True, verbose=False)
    prompt = make_prompt(tok, args.prompt_tokens)
    del tok
    out: dict = {
        "model": args.model,
        "n_layers": n_layers,
        **machine(),
        "loadavg_start": loadavg(),
        "whole": {},
        "swarm": {},
        "ratio_swarm_over_whole": {},
    }
    for threads in (1, 2):
        out["whole"][thread_label(threads)] = bench_whole(path, prompt, args.decode, threads, args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-swarm-") as tmp:
        for i, (name, threads, spin) in enumerate(SWARM_CONFIGS):
            ps = start_swarm(Path(tmp) / f"cfg{i}", path, n_layers, threads, spin)
            try:
                r = bench_swarm(path, prompt, args.decode, ps, args.repeats)
            finally:
                ps.stop_all()
            r["threads_per_peer"], r["GOMP_SPINCOUNT"] = threads, spin
            out["swarm"][name] = r
            whole = out["whole"][thread_label(threads)]
            out["ratio_swarm_over_whole"][name] = {
                "decode_tok_s": round(r["decode_tok_s"] / whole["decode_tok_s"], 3),
                "ttft": round(r["ttft_ms"] / whole["ttft_ms"], 3),
            }
    out["best_swarm_config"] = max(out["swarm"], key=lambda k: out["swarm"][k]["decode_tok_s"])
    out["loadavg_end"] = loadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
