"""Failover stall: how long a generation stops when its middle peer dies, leaves or freezes.

A loopback swarm of SmolLM2 (0:10, two peers for 10:20, 20:30; records refreshed every 3 s).
For each fault (kill -9 of the peer's whole process tree, SIGTERM of the peer process, which then
leaves gracefully, SIGSTOP of the whole tree) and each
of `--runs` generations: after 5 tokens the routed middle peer gets the signal; the client fails
over by replay. Reported per fault, p50 / p90 over the runs, in ms:
  stall_ms: the client's own figure (telemetry): from the failing step's start at that hop to the
      replacement caught up (detection + re-plan + open + replay);
  worst_gap_ms: the longest time between two tokens the user saw;
  normal_gap_ms: the median time between tokens of the same generations.
Every generation's text is checked against llama.cpp's whole model. Prints one JSON object.

    python scripts/bench_failover.py [--runs 10] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

from swarm import Client
from swarm.localswarm import PeerSet, signal_tree
from swarm.models import resolve_model

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
FAULTS = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP}


def serve(path: Path, layers: str, *join: str) -> tuple[str, ...]:
    return ("serve", "--model", str(path), "--layers", layers, "--threads", "1", "--cache-tokens", "4096",
            "--announce-period", "3", *join)  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated subset of " + ",".join(FAULTS)
    )
    args = ap.parse_args()
    path = resolve_model("smollm2-135m", fetch=True)
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, flash_attn=True, verbose=False)
    want = llm.create_completion(PROMPT, max_tokens=args.tokens, temperature=0.0)["choices"][0]["text"]
    del llm
    out: dict = {"model": "smollm2-135m", "runs": args.runs, "tokens": args.tokens}
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        ps = PeerSet(Path(tmp))
        try:
            first = ps.start("a", *serve(path, "0:10", "--new-swarm"))
            join = ("--initial-peers", first.maddrs[0])
            peers = {name: ps.start(name, *serve(path, "10:20", *join)) for name in ("m1", "m2")}
            ps.start("z", *serve(path, "20:30", *join))
            by_id = {p.peer_id: name for name, p in peers.items()}
            with Client(str(path), initial_peers=first.maddrs) as client:
                for fault in args.faults.split(","):
                    sig = FAULTS[fault]
                    stalls, worst, normal = [], [], []
                    for _ in range(args.runs):
                        stream = client.stream(PROMPT, max_new_tokens=args.tokens)
                        victim = None
                        for i, _ in enumerate(stream, 1):
                            if i == 5:
                                victim = by_id[stream.telemetry.route[1].peer_id]
                                if sig == signal.SIGTERM:  # the peer process alone: it leaves gracefully
                                    peers[victim].proc.send_signal(sig)
                                else:  # the whole machine dies or freezes
                                    signal_tree(peers[victim], sig)
                        got = stream.result
                        assert got.text == want, f"{fault}: text differs from llama.cpp's"
                        stalls.append(sum(f.stall_ms for f in got.telemetry.failovers))
                        gaps = got.telemetry.token_latencies_ms[1:]
                        worst.append(max(gaps))
                        normal.append(statistics.median(gaps))
                        if sig == signal.SIGSTOP:
                            signal_tree(peers[victim], signal.SIGCONT)
                        else:
                            peers[victim].proc.wait(30)
                            peers[victim] = ps.start(victim, *serve(path, "10:20", *join))
                            by_id[peers[victim].peer_id] = victim
                        time.sleep(3)  # let the victim's new record (or thawed one) settle in the DHT
                    out[fault] = {
                        "stall_ms_p50": pct(stalls, 50),
                        "stall_ms_p90": pct(stalls, 90),
                        "worst_gap_ms_p50": pct(worst, 50),
                        "worst_gap_ms_p90": pct(worst, 90),
                        "normal_gap_ms_p50": pct(normal, 50),
                    }
                    print(json.dumps({fault: out[fault]}), file=sys.stderr)
        finally:
            for p in ps.started:
                signal_tree(p, signal.SIGCONT)
            ps.stop_all()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
