"""Spot checks of remote computation: the honest band, detection of lying peers, and the cost.

A loopback swarm of SmolLM2: 0:10, two honest peers for 10:20 (one with 1 thread, one with 2), two
for 20:30 (the last hop's checks replay its tokens exactly on the other).
Reported (one JSON object on stdout; progress on stderr):

  kernel_proxy: how far honest hidden states of span 10:20 move when the same steps are computed
      another way, in-process: decode steps regrouped into steps of 2..64 rows, flash attention
      off. A peer on another kind of machine (other SIMD kernels) rounds differently in the same
      way; the band (`swarm.route.verify.DEFAULT_BAND`) must sit above these, with a margin.
  honest: generations of `--tokens` tokens in batches of 1 to 8 concurrent sessions, each checked
      at its last decode step (every decode row compared), served by the 1-thread peer and checked
      by the 2-thread one, then the other way round: checked decode steps, the largest measured
      rel L2 and smallest cosine, and how many checks were flagged (must be 0).
  liars: per lying mode (`SWARM_TEST_LIE`: noise on every step, on 1 in 10, on 1 in 100, a peer
      serving Q4_0, Q3_K_M and Q2_K requantizations) of a peer serving `--liar-span` (10:20; 20:30
      for the last hop, whose noise goes on its logits), `--liar-runs` generations at the default check
      policy (seed = run number): the decode step whose check caught the liar (None: not caught in
      `--liar-tokens` tokens), the checks of the liar's hop until then, the measured rel L2, the
      generated token the text was rolled back to (the repair: the route rebuilt without the liar
      recomputes from the token after its first wrong row), whether the stream had to withdraw
      text it had given out (a `Correction`), and whether the final text equals llama.cpp's whole
      model.
  cost: median decode tokens/s without checks and with the default policy (generations
      alternating), and the relative cost; median TTFT of each, and with `verify_prefill` (off by
      default: the prompt's rows are checked before the first token, waited for). With
      `--cost-threads 1` (the default) the 2-thread peer of 10:20 is first replaced by a 1-thread
      one, as every other peer: five peers and the client share this machine's cores, and a 2-thread
      llama.cpp peer among them stalls whenever any other process runs (its threads wait on each
      other), which charges the checks' replays, run on other peers, for an oversubscribed
      machine; `--cost-threads mixed` measures in the honest part's layout.
  receipt: microseconds to compute one step's receipt of one decode row.

    python scripts/bench_verify.py [--tokens 48] [--liar-runs 5] [--liar-tokens 64] [--cost-runs 8] \
        [--liar-span 20:30] [--sweep-steps 40] [--cost-threads 1|mixed]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path

import llama_cpp
import numpy as np

from swarm.client.generate import GenerationRequest, TokenStream
from swarm.client.remote import connect_swarm
from swarm.ggml_bridge.embed import TokenEmbedder
from swarm.ggml_bridge.executor import SpanExecutor
from swarm.kv.prefix import PREFIX_BLOCK_TOKENS
from swarm.localswarm import PeerSet
from swarm.models import resolve_model
from swarm.route.failover import Exclusions
from swarm.route.verify import DEFAULT_BAND, CheckPolicy, Standing, compare
from swarm.wire import receipt

PROMPT = "The old lighthouse keeper climbed the stairs one last time. At the top, he found"
MODES = ("noise", "noise:10", "noise:100", "lazy:Q4_0", "lazy:Q3_K_M", "lazy:Q2_K")


def serve(path: Path, layers: str, threads: int, *join: str) -> tuple[str, ...]:
    return ("serve", "--model", str(path), "--layers", layers, "--threads", str(threads),
            "--cache-tokens", "8192", *join)  # fmt: skip


PROXY_SPANS = {"smollm2-135m": (10, 20), "qwen2.5-coder-0.5b": (8, 16)}


def kernel_proxy(name: str, n_new: int) -> dict:
    """How far a middle span's honest outputs move when its steps are computed otherwise than a
    client sent them (the prompt as one step, then one row per decode step): as one prefill in the
    peers' 64-row ubatches (what a regrouped check computes), or with flash attention off (another
    attention kernel: the kind of rounding another machine's kernels may add)."""
    path = resolve_model(name, fetch=True)
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, flash_attn=True, verbose=False)
    text = llm.create_completion(PROMPT, max_tokens=n_new, temperature=0.0)["choices"][0]["text"]
    prompt = llm.tokenize(PROMPT.encode())
    ids = prompt + llm.tokenize(text.encode(), add_bos=False)[:n_new]
    del llm
    x, n_prompt = TokenEmbedder(path).embed(ids), len(prompt)
    a, b = PROXY_SPANS[name]

    def run(start: int, end: int, inputs: np.ndarray, prefill: bool = False, flash: bool = True) -> np.ndarray:
        ex = SpanExecutor.for_span(path, start, end, n_ctx_tokens=1024, n_seq_max=1, n_threads=1,
                                   flash_attn=flash, n_batch=PREFIX_BLOCK_TOKENS)
        if prefill:
            out = ex.forward(0, 0, inputs)
        else:
            out = np.concatenate([ex.forward(0, 0, inputs[:n_prompt])]
                                 + [ex.forward(0, i, inputs[i : i + 1]) for i in range(n_prompt, len(inputs))])
        ex.close()
        return out

    into = run(0, a, x) if a else x
    ref = run(a, b, into)
    out = {"span": f"{a}:{b}", "rows": len(ids)}
    for label, kw in (("one_prefill", {"prefill": True}), ("flash_off", {"flash": False})):
        m = compare(run(a, b, into, **kw), ref)
        out[label] = {"rel_l2": float(f"{m.rel_l2:.3g}"), "cosine": round(m.cosine, 8)}
    return out


def receipt_cost() -> dict:
    """Microseconds to compute one step's receipt (`swarm.wire.receipt`) of one decode row, per hidden
    size (a peer computes one per step, the client one per hop and step)."""
    out = {}
    for n in (576, 896, 2048):
        x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
        out[f"hidden_{n}_us"] = round(min(timeit.repeat(lambda: receipt(x), number=20000, repeat=5)) / 20000 * 1e6, 2)
    return out


def generate(engine, tokenizer, policy: CheckPolicy | None, n_tokens: int) -> TokenStream:
    engine.check_policy = policy
    stream = TokenStream(engine, tokenizer, tokenizer.encode(PROMPT), GenerationRequest(max_new_tokens=n_tokens),
                         backend="swarm")
    stream.run()
    return stream


def wait_reachable(engine, peer_id: str, deadline_s: float = 60.0) -> None:
    """Wait until the client has the peer's announcement and an RTT for it (a first dial on a busy
    machine can outlast one probe, and a peer that missed a probe is excluded for a minute)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        spans = engine._conn.loop.run(engine.directory.peers(frozenset(), True), 30)
        if any(s.peer_id == peer_id and s.rtt_ms is not None and s.rtt_ms < float("inf") for s in spans):
            return
    raise SystemExit(f"peer {peer_id} is not reachable")


def wait_gone(engine, peer_id: str, deadline_s: float = 90.0) -> None:
    """Wait until the DHT no longer lists the peer (stopped: its record is withdrawn or expires)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        spans = engine._conn.loop.run(engine.directory.peers(frozenset(), True), 30)
        if all(s.peer_id != peer_id for s in spans):
            return
        time.sleep(1.0)  # polling the DHT: nothing to wait on but the record's expiry
    raise SystemExit(f"peer {peer_id} is still listed")


def fresh_standing(engine) -> None:
    """Forget every exclusion and offence: each run starts as a new client would."""
    engine.exclusions = Exclusions(engine.policy.exclusion_s)
    engine.checks = dataclasses.replace(engine.checks, standing=Standing(CheckPolicy()))


def honest(engine, tokenizer, n_tokens: int, names: dict) -> dict:
    last = CheckPolicy(rate=0.0, first_check_step=n_tokens - 2)
    rel, cos, flagged, steps, served = [], [], 0, 0, {}
    fresh_standing(engine)
    for steer in (False, True):
        routed: dict[str, int] = {}
        for batch in range(1, 9):
            streams: list[TokenStream] = []

            def one():
                streams.append(generate(engine, tokenizer, last, n_tokens))

            threads = [threading.Thread(target=one) for _ in range(batch)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for s in streams:
                for c in s.telemetry.checks:
                    rel.append(c.rel_l2)
                    cos.append(c.cosine)
                    flagged += c.verdict != "ok"
                    n = c.rows - s.telemetry.prompt_tokens
                    steps += n
                    key = f"{names[c.peer_id]} checked by {','.join(names[p] for p in c.checkers)}"
                    served[key] = served.get(key, 0) + n
                    if c.start == 10:  # the 10:20 peer that served: steered away from next
                        routed[c.peer_id] = routed.get(c.peer_id, 0) + 1
        if not steer and routed:  # then the other 10:20 peer serves: price the one that did out of routes
            fresh_standing(engine)
            engine.checks.standing.record(max(routed, key=routed.get), time.monotonic())
    return {"checked_decode_steps": steps, "by_peers": served, "flagged": flagged,
            "max_rel_l2": float(f"{max(rel):.3g}"), "min_cosine": min(cos),
            "band": dataclasses.asdict(DEFAULT_BAND)}


def liars(ps: PeerSet, path: Path, join: tuple[str, ...], want: str, args) -> dict:
    """Each run starts a liar whose lies are seeded by the run number (noise modes) and a new client
    whose check schedule is too, so the runs show the spread of detection steps. (A new client per
    run: a client keeps the records it has seen until they expire, stopped liars' too.)"""
    out = {}
    for mode in args.modes.split(","):
        runs, liar = [], None
        for seed in range(args.liar_runs):
            if liar is None or not mode.startswith("lazy"):
                if liar is not None:
                    liar.stop()
                    ps.started.remove(liar)
                liar = ps.start(f"liar-{mode.replace(':', '-')}-{seed}", *serve(path, args.liar_span, 1, *join),
                                env={"SWARM_TEST_LIE": mode, "SWARM_TEST_LIE_SEED": str(seed)})
            tokenizer, engine = connect_swarm(str(path), [join[1]])
            engine.settle_checks = True
            try:
                wait_reachable(engine, liar.peer_id)
                policy = CheckPolicy(seed=seed, sweep_steps=args.sweep_steps)
                s = generate(engine, tokenizer, policy, args.liar_tokens)
            finally:
                engine.close()
            of_liar = [c for c in s.telemetry.checks if c.peer_id == liar.peer_id]
            caught = next((c for c in of_liar if c.verdict == "caught"), None)
            routed = [f.peer_id for f in s.telemetry.failovers] + [h.peer_id for h in s.telemetry.route]
            rewound = [f.rewound_to for f in s.telemetry.failovers if f.rewound_to >= 0]
            runs.append({
                "routed": liar.peer_id in routed,
                "caught_at_decode_step": caught.decode_step if caught else None,
                "rolled_back_to_token": rewound[0] - s.telemetry.prompt_tokens if rewound else None,
                "corrections": len(s.corrections),
                "checks_until_caught": of_liar.index(caught) + 1 if caught else len(of_liar),
                "rel_l2": float(f"{caught.rel_l2:.3g}") if caught else None,
                "cosine": round(caught.cosine, 6) if caught else None,
                "text_equal": s.result.text == want,
                "tokens": len(s.result.tokens),
            })
            print(json.dumps({mode: runs[-1]}), file=sys.stderr, flush=True)
        liar.stop()
        ps.started.remove(liar)
        steps = [r["caught_at_decode_step"] for r in runs]
        out[mode] = {"runs": runs, "caught": sum(x is not None for x in steps),
                     "caught_within_50": sum(x is not None and x < 50 for x in steps),
                     "text_equal": sum(r["text_equal"] for r in runs),
                     "corrected": sum(r["corrections"] > 0 for r in runs)}
    return out


def cost(engine, tokenizer, args) -> dict:
    """Decode tokens/s and TTFT without checks, with the default policy, and with `verify_prefill`
    (the prompt's rows checked before the first token), in pairs.

    Each pair is one plain and one checked generation back to back, the order swapped every pair;
    the cost is the median of the pairs' ratios, with a 90% bootstrap interval of that median. A
    2-core VM's speed drifts 10-30% within minutes, which swamps a few percent between two medians
    taken over minutes; within a pair both sides see the same machine. `replayed_rows_pct` is the
    compute the checks ask of the swarm: rows replayed on checkers per row computed on the route;
    `checks` and `flagged` count the checked generations' checks and those not "ok" (honest peers:
    false positives).
    """
    plain, checked, prefill, ratios = [], [], [], []
    replayed = routed = n_checks = flagged = 0
    for i in range(args.cost_runs):
        policy = CheckPolicy(seed=i, sweep_steps=args.sweep_steps)
        pair = {}
        for side in (("plain", "checked") if i % 2 == 0 else ("checked", "plain")):
            fresh_standing(engine)
            pair[side] = generate(engine, tokenizer, policy if side == "checked" else None, args.tokens).telemetry
        plain.append(pair["plain"])
        checked.append(pair["checked"])
        ratios.append(pair["checked"].decode_tokens_per_s / pair["plain"].decode_tokens_per_s)
        t = pair["checked"]
        replayed += sum(c.rows for c in t.checks)
        n_checks += len(t.checks)
        flagged += sum(c.verdict != "ok" for c in t.checks)  # every peer here is honest
        routed += (t.prompt_tokens + t.generated_tokens) * len(t.route)
        fresh_standing(engine)
        prefill.append(generate(engine, tokenizer, dataclasses.replace(policy, verify_prefill=True), args.tokens).telemetry)
    p, c = (statistics.median(t.decode_tokens_per_s for t in ts) for ts in (plain, checked))
    ttft = [statistics.median(t.ttft_ms for t in ts) for ts in (plain, checked, prefill)]
    boot = np.random.default_rng(0).choice(ratios, size=(10000, len(ratios)))
    lo, hi = np.percentile(np.median(boot, axis=1), [5, 95])
    return {"plain_tokens_per_s": round(p, 1), "checked_tokens_per_s": round(c, 1),
            "pairs": len(ratios), "cost_pct": round(100.0 * (1.0 - statistics.median(ratios)), 1),
            "cost_pct_90ci": [round(100.0 * (1.0 - hi), 1), round(100.0 * (1.0 - lo), 1)],
            "replayed_rows_pct": round(100.0 * replayed / max(routed, 1), 1),
            "checks": n_checks, "flagged": flagged,
            "default_rate": CheckPolicy().rate,
            "first_check_step": CheckPolicy().first_check_step, "sweep_steps": args.sweep_steps,
            "ttft_ms": {"plain": round(ttft[0], 1), "checked": round(ttft[1], 1),
                        "verify_prefill": round(ttft[2], 1)},
            "verify_prefill_ttft_cost_pct": round(100.0 * (ttft[2] / ttft[0] - 1.0), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--liar-runs", type=int, default=5)
    ap.add_argument("--liar-tokens", type=int, default=64)
    ap.add_argument("--cost-runs", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sweep-steps", type=int, default=CheckPolicy().sweep_steps,
                    help="decode steps between sweeps of every hop (CheckPolicy.sweep_steps; 0: none)")
    ap.add_argument("--liar-span", default="10:20", help="the liars' layers: 10:20, or 20:30 (the last hop)")
    ap.add_argument("--cost-threads", choices=("1", "mixed"), default="1",
                    help="the cost part's peers: 1 thread each, or the honest part's 1- and 2-thread peers")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: kernel,honest,liars,cost")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    path = resolve_model("smollm2-135m", fetch=True)
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, flash_attn=True, verbose=False)
    want = llm.create_completion(PROMPT, max_tokens=args.liar_tokens, temperature=0.0)["choices"][0]["text"]
    out: dict = {"model": "smollm2-135m", "tokens": args.tokens, "receipt": receipt_cost()}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        os.environ["SWARM_HOME"] = tmp  # the client's evidence file
        del llm
        if "kernel" not in skip:
            out["kernel_proxy"] = {name: kernel_proxy(name, args.liar_tokens) for name in PROXY_SPANS}
            print(json.dumps({"kernel_proxy": out["kernel_proxy"]}), file=sys.stderr, flush=True)
        ps = PeerSet(Path(tmp))
        try:
            first = ps.start("a", *serve(path, "0:10", 1, "--new-swarm"))
            join = ("--initial-peers", first.maddrs[0])
            h1 = ps.start("h1-threads1", *serve(path, "10:20", 1, *join))
            h2 = ps.start("h2-threads2", *serve(path, "10:20", 2, *join))
            z = ps.start("z", *serve(path, "20:30", 1, *join))
            z2 = ps.start("z2", *serve(path, "20:30", 1, *join))  # the last hop's checker
            tokenizer, engine = connect_swarm(str(path), list(first.maddrs))
            engine.settle_checks = True
            try:
                names = {h1.peer_id: "threads1", h2.peer_id: "threads2", z.peer_id: "last", z2.peer_id: "last2"}
                if "honest" not in skip:
                    out["honest"] = honest(engine, tokenizer, args.tokens, names)
                    print(json.dumps({"honest": out["honest"]}), file=sys.stderr, flush=True)
                if "cost" not in skip:
                    if args.cost_threads == "1":
                        h3 = ps.start("h3-threads1", *serve(path, "10:20", 1, *join))
                        h2.stop()
                        ps.started.remove(h2)
                        wait_gone(engine, h2.peer_id)
                        wait_reachable(engine, h3.peer_id)
                    out["cost"] = {"threads": args.cost_threads, **cost(engine, tokenizer, args)}
                    print(json.dumps({"cost": out["cost"]}), file=sys.stderr, flush=True)
                if "liars" not in skip:
                    out["liars"] = liars(ps, path, join, want, args)
            finally:
                engine.close()
        finally:
            ps.stop_all()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
