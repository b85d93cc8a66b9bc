"""One swarm of 10,000 peers in virtual time: chain coverage, generations and planner cost under churn.

Runs the simulator's acceptance scenarios (sim/scenarios.py: `swarm43_10k`, `swarm80_10k`): 10,000
peers join an empty swarm through the real placement over 5 virtual minutes, then for 10 virtual
minutes 10% of them leave per minute (half gracefully, half crashing) and as many join, while
clients generate through the real route session and failover policy. Prints the figures of each
scenario as a table, then one JSON line per scenario.

    .venv/bin/python scripts/bench_sim.py                       # both 10,000-peer scenarios
    .venv/bin/python scripts/bench_sim.py swarm43_300           # any named scenario
    .venv/bin/python scripts/bench_sim.py --peers 2000 swarm43_10k
    .venv/bin/python scripts/bench_sim.py --model deepseek-v4-flash --peers 300 swarm43_300
    .venv/bin/python scripts/bench_sim.py --push swarm43_300      # clients chain routes for server push

Acceptance (issue item 4): a complete chain at least 99% of virtual time, at least 99% of
generations complete, the planner under 50 ms per route at 10,000 peers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.runner import run  # noqa: E402
from sim.scenarios import MODELS, SCENARIOS  # noqa: E402

TABLE = (
    ("complete chain, fraction of virtual time", "complete_chain_time", ">= 0.99"),
    ("served layer-slots on a complete chain", "layers_on_chain", ""),
    ("dead-end peers, mean / max", ("dead_end_peers_mean", "dead_end_peers_max"), ""),
    ("distinct spans served, mean", "distinct_spans_mean", ""),
    ("peers serving, mean", "peers_serving_mean", "~ n_peers"),
    (
        "routable tokens/s (max flow), mean / min",
        ("routable_tokens_per_s_mean", "routable_tokens_per_s_min"),
        "",
    ),
    ("joins / refused", ("joins", "joins_refused"), ""),
    (
        "departures: graceful / reset / freeze",
        ("departures_leave", "departures_reset", "departures_freeze"),
        "",
    ),
    ("rebalancing moves / with open sessions", ("moves", "moves_with_sessions"), "- / 0"),
    ("generations / completed / exact", ("generations", "completed", "exact"), ""),
    ("generations completed, fraction", "completed_fraction", ">= 0.99"),
    ("failed, by reason", "failed", ""),
    ("decode tokens/s per generation, p50 / p10", ("tokens_per_s_p50", "tokens_per_s_p10"), ""),
    ("time to first token p50, ms", "ttft_ms_p50", ""),
    ("failovers, by reason", "failover_reasons", ""),
    ("failover stall p50 / p99 / max, ms", ("stall_ms_p50", "stall_ms_p99", "stall_ms_max"), ""),
    (
        "plan_route wall ms per route in the run p50 / p99 / max",
        ("plan_route_ms_p50", "plan_route_ms_p99", "plan_route_ms_max"),
        "< 50",
    ),
    (
        "plan_route wall ms over the final swarm, alone, p50 / p99",
        ("plan_route_final_ms_p50", "plan_route_final_ms_p99"),
        "< 50",
    ),
    ("choose_span wall ms per join p50 / p99", ("choose_span_ms_p50", "choose_span_ms_p99"), ""),
    ("rebalance wall ms per evaluation p50 / p99", ("rebalance_ms_p50", "rebalance_ms_p99"), ""),
    ("wall time of the run, s", "wall_s", ""),
)


def _cell(summary: dict, key) -> str:
    if isinstance(key, tuple):
        return " / ".join(_cell(summary, k) for k in key)
    v = summary.get(key)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _progress(t0: float):
    def show(virtual_s: float, sim) -> None:
        m = sim.metrics
        print(
            f"  virtual {virtual_s / 60:4.0f} min, wall {time.perf_counter() - t0:6.0f} s: "
            f"{len(sim.world.layout)} spans, {sum(n for n, _ in sim.world.layout.values()):.0f} serving, "
            f"{len(m.generations)} generations done, {len(m.moves)} moves",
            file=sys.stderr,
            flush=True,
        )

    return show


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "names", nargs="*", default=["swarm43_10k", "swarm80_10k"], help="scenarios (sim/scenarios.py)"
    )
    ap.add_argument("--peers", type=int, help="override the number of peers")
    ap.add_argument("--seed", type=int, help="override the seed")
    ap.add_argument("--model", choices=sorted(MODELS), help="serve this model's real sizes and volunteer mix")
    ap.add_argument("--push", action="store_true", help="server push: peers send each step to the next peer")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    summaries = []
    for name in args.names:
        sc = SCENARIOS[name]
        if args.peers:
            sc = replace(sc, members=replace(sc.members, n_peers=args.peers))
        if args.seed is not None:
            sc = replace(sc, seed=args.seed)
        if args.model:
            model, mix = MODELS[args.model]
            sc = replace(sc, model=model, mix=mix)
        if args.push:
            sc = replace(sc, load=replace(sc.load, push=True))
        print(f"running {name}: {sc.members.n_peers} peers, {sc.model.name} ...", file=sys.stderr, flush=True)
        s = run(sc, _progress(time.perf_counter())).summary()
        s["load_average"] = round(os.getloadavg()[0], 2)
        summaries.append(s)
        how = "server push" if sc.load.push else "client relay"
        print(f"\n## {name}: {sc.members.n_peers} peers, {sc.model.name}, seed {sc.seed}, {how}\n")
        print("| figure | value | target |\n|---|---|---|")
        for label, key, target in TABLE:
            print(f"| {label} | {_cell(s, key)} | {target} |")
    print()
    for s in summaries:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
