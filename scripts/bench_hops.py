"""Per-hop cost of a 3-peer loopback swarm, side by side in one run: relay vs server push, stream
kind, and (with --all) inline threshold and pinning.

Same model, prompt and steps for every setting (1 thread per peer, greedy, ~128-token prompt):
  whole               llama.cpp's whole model in this process (llama_cpp.Llama), 1 thread: the oracle;
  libp2p/relay        streams through the p2pd daemons, the client relays every hop's output;
  direct/relay        direct TCP streams (swarm.direct), relayed by the client;
  libp2p/push         server push (swarm/client/session.py): each peer pushes its output to the next;
  direct/push         both: the defaults now.
  With --all also, on peers started with the older 2 ms inline threshold (--inline-max-ms) and on
  peers pinned one core each, round-robin (taskset -a): direct/relay/2ms, libp2p/relay/2ms,
  direct/push/pinned.
  Peers run on uvloop's event loop and the client on asyncio's (the defaults, swarm/eventloop.py).
  With --loops also: everything on asyncio's loop (the default before 2026-12-06; .../asyncio), and
  the client on uvloop's too (.../uvloop-client), for direct/relay and direct/push.
Per-hop overhead = (client's step time - the hops' reported compute) / hops, p50 (bench_swarm.py's
measure). Every peer set is started first; then in each of --rounds rounds every setting runs once
(the best of --repeats generations), in an order rotated by one each round; the summary gives each
round's figures and their medians. The settings of one peer set share its peers: the client
switches with `RemoteEngine.transport.direct` and `RemoteEngine.push`, the peers offer all. Prints
one JSON object.

    .venv/bin/python scripts/bench_hops.py [--model smollm2-135m] [--decode 64] [--repeats 2] \
        [--rounds 3] [--all] [--loops]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_swarm as bs  # noqa: E402 - sibling script: whole-model and swarm measurements

from swarm import Client  # noqa: E402
from swarm.eventloop import EVENT_LOOP_ENV  # noqa: E402
from swarm.manifest import build_manifest  # noqa: E402
from swarm.models import resolve_model  # noqa: E402

from tests.helpers.peers import PeerSet  # noqa: E402 - the repo root is put on sys.path by bench_swarm


def start(root: Path, path: Path, n_layers: int, inline_ms: float, pin: bool, loop: str) -> PeerSet:
    """Three peers for equal thirds of the layers, 1 thread each, on event loop `loop`; pinned
    round-robin when `pin`."""
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    ps = PeerSet(root)
    cores = itertools.cycle(sorted(os.sched_getaffinity(0)))
    try:
        for i in range(3):
            join = ("--new-swarm",) if i == 0 else ("--initial-peers", ps.started[0].maddrs[0])
            peer = ps.start(f"p{i}", "serve", "--model", str(path), "--layers", f"{cuts[i]}:{cuts[i + 1]}",
                            "--threads", "1", "--cache-tokens", "2048", "--inline-max-ms", str(inline_ms),
                            *join, env={EVENT_LOOP_ENV: loop})
            if pin:
                subprocess.run(["taskset", "-a", "-cp", str(next(cores)), str(peer.proc.pid)],
                               check=True, capture_output=True)
    except BaseException:
        ps.stop_all()
        raise
    return ps


def measure(path: Path, prompt: str, n_decode: int, ps: PeerSet, direct: bool, push: bool,
            repeats: int, loop: str) -> dict:
    """Best of `repeats` generations (by decode tokens/s) through `ps`: direct streams or libp2p,
    server push or relay, the client on event loop `loop`."""
    os.environ[EVENT_LOOP_ENV] = loop  # read when the client's loop thread starts
    with Client(str(path), initial_peers=ps.started[0].maddrs) as client:
        client._engine.transport.direct = direct  # noqa: SLF001 - the engine's documented switches
        client._engine.push = push  # noqa: SLF001
        client.generate(prompt[:40], max_new_tokens=4)  # warm-up: probes, streams, cost model
        runs = [bs._swarm_run(client, prompt, n_decode) for _ in range(repeats)]  # noqa: SLF001
    return max(runs, key=lambda r: r["decode_tok_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2,
                    help="generations per setting per round; the best is kept")
    ap.add_argument("--rounds", type=int, default=3, help="rounds in which every setting runs once, in turn")
    ap.add_argument("--all", action="store_true", help="also the 2 ms inline threshold and pinned peers")
    ap.add_argument("--loops", action="store_true",
                    help="also all on asyncio's event loop, and the client on uvloop's")
    args = ap.parse_args()
    path = resolve_model(args.model)
    n_layers = build_manifest(path).n_layers
    tok = llama_cpp.Llama(model_path=str(path), n_ctx=256, vocab_only=True, verbose=False)
    prompt = bs.make_prompt(tok, 128)
    del tok
    out: dict = {"model": args.model, "cpus": os.cpu_count(), "loadavg_start": bs.loadavg()}
    whole = bs.bench_whole(path, prompt, args.decode, 1, args.repeats)
    out["whole"] = whole
    # (inline ms, pinned, the peers' loop, [(direct, push, the client's loop, name suffix)])
    both = [(d, p, "asyncio", "") for p in (False, True) for d in (False, True)]
    peer_sets = [(10.0, False, "uvloop", both)]
    if args.loops:
        peer_sets += [(10.0, False, "asyncio", [(True, False, "asyncio", "/asyncio"),
                                                (True, True, "asyncio", "/asyncio")]),
                      (10.0, False, "uvloop", [(True, False, "uvloop", "/uvloop-client"),
                                               (True, True, "uvloop", "/uvloop-client")])]
    if args.all:
        peer_sets += [(2.0, False, "uvloop", [(False, False, "asyncio", "/2ms"),
                                              (True, False, "asyncio", "/2ms")]),
                      (10.0, True, "uvloop", [(True, True, "asyncio", "/pinned")])]
    # every peer set starts first and the settings take turns, round after round (rotated): a
    # shared VM's speed drifts by 10-30% within minutes, more than the differences measured here
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hops-") as tmp, contextlib.ExitStack() as stack:
        plan = []
        for i, (inline_ms, pin, peer_loop, clients) in enumerate(peer_sets):
            ps = start(Path(tmp) / f"s{i}", path, n_layers, inline_ms, pin, peer_loop)
            stack.callback(ps.stop_all)
            for direct, push, client_loop, suffix in clients:
                name = f"{'direct' if direct else 'libp2p'}/{'push' if push else 'relay'}{suffix}"
                plan.append((name, ps, direct, push, client_loop))
        for r in range(args.rounds):
            for name, ps, direct, push, client_loop in plan[r % len(plan):] + plan[: r % len(plan)]:
                runs.setdefault(name, []).append(
                    measure(path, prompt, args.decode, ps, direct, push, args.repeats, client_loop))
    out["swarm"] = runs
    out["summary"] = {
        name: {
            "decode_tok_s": [r["decode_tok_s"] for r in rs],
            "swarm_over_whole_median": round(statistics.median(r["decode_tok_s"] for r in rs)
                                             / whole["decode_tok_s"], 3),
            "overhead_per_hop_ms_p50": [round(r["overhead_per_hop_ms_p50"], 3) for r in rs],
            "overhead_per_hop_ms_median": round(
                statistics.median(r["overhead_per_hop_ms_p50"] for r in rs), 3),
            "transports": rs[0]["transports"],
        }
        for name, rs in runs.items()
    }
    out["loadavg_end"] = bs.loadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
