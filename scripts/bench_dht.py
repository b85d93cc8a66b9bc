"""A real hivemind DHT at small scale: lookup latency, and how fast an announcement and a withdrawal spread.

Starts `--nodes` (default 40) real DHT nodes on 127.0.0.1 through swarm's own wrapper (`SwarmDHT`: each
node is a hivemind DHT process with its own p2pd; all are driven from this process's one event loop).
Node 0 bootstraps; every later node joins through node 0 and one random earlier node. Then:

  setup: `--announcers` nodes announce contiguous spans covering a 30-layer model (signed records), one
      at a time on an idle swarm: the announce call's own latency;
  (a) lookup latency: every node calls get_announcements `--lookups` times, one call at a time across
      the whole swarm (idle), then all nodes at once (a burst, as many clients starting together);
      p50 / p90 / max in ms, the share of lookups that returned every announced span, and the CPU
      time one idle lookup costs, summed over every process of the swarm (all on this machine);
  (b) announce spread: a node that has not announced yet announces a whole-model span while every node
      polls get_announcements until it sees the record, `--concurrency` lookups at a time in turn;
      reported: the announce call, the time from its start until the first and the last node saw it,
      and how many lookups started after the call had returned still missed the record;
  (c) withdrawal spread: the same node withdraws (SwarmDHT.withdraw, a signed tombstone); the same
      polling until no node lists it any more.
(b) and (c) repeat `--trials` times with different nodes; p50 and max over trials. Records live 600 s,
so what disappears was withdrawn, never expired. A node's time includes waiting for its turn to poll
(poll_sweep_s: one sweep of every node without any change), so first/last are upper bounds.
Prints a table on stderr and one JSON line on stdout.

    python scripts/bench_dht.py [--nodes 40] [--trials 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from swarm.dht.node import SwarmDHT
from swarm.dht.records import Announcement

MODEL = "d17b" * 16
N_LAYERS = 30
EXPIRATION_S = 600.0
"""Records in this bench outlive it: what disappears was withdrawn, never expired."""
DEADLINE_S = 60.0
"""Polling for one change gives up after this long; nodes not reached by then are counted as missing."""


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its descendants (DHT processes, p2pd)."""
    parent_of, used = {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split() if d.name.isdigit() else None
        except OSError:
            continue
        if fields:
            parent_of[int(d.name)] = int(fields[1])
            used[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {os.getpid()}, True
    while grew:
        new = {pid for pid, parent in parent_of.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(used.get(pid, 0.0) for pid in tree)


def stats_ms(xs_s: list[float]) -> dict[str, float]:
    """p50 / p90 / max of durations given in seconds, in ms."""
    ms = np.asarray(xs_s) * 1000.0
    return {
        "p50": round(float(np.percentile(ms, 50)), 1),
        "p90": round(float(np.percentile(ms, 90)), 1),
        "max": round(float(ms.max()), 1),
    }


def span_record(node: SwarmDHT, start: int, end: int) -> Announcement:
    return Announcement(
        peer_id=node.peer_id,
        addrs=tuple(node.visible_maddrs()),
        model_id=MODEL,
        start=start,
        end=end,
        decode_steps_per_s=100.0,
        prefill_tokens_per_s=400.0,
        free_cache_tokens=8192,
        max_sessions=4,
        sessions_free=4,
        version="bench",
        protocol=1,
        public_name=None,
        expires_at=0.0,
    )


async def start_nodes(n: int, root: Path, rng: random.Random) -> list[SwarmDHT]:
    """Node 0, then each next node joined through node 0 and one random earlier node."""
    nodes = [await SwarmDHT.start(data_dir=root / "n0")]
    for i in range(1, n):
        via = {0, rng.randrange(len(nodes))}
        joins = [m for j in sorted(via) for m in nodes[j].visible_maddrs()]
        nodes.append(await SwarmDHT.start(joins, data_dir=root / f"n{i}"))
        if i % 10 == 9:
            print(f"  {i + 1} nodes up", file=sys.stderr)
    return nodes


async def timed_lookup(node: SwarmDHT) -> tuple[float, list[Announcement]]:
    t0 = time.perf_counter()
    found = await node.get_announcements(MODEL)
    return time.perf_counter() - t0, found


async def sweep_s(nodes: list[SwarmDHT], concurrency: int) -> float:
    """Seconds for every node to look up once, `concurrency` lookups in flight (as (b) and (c) poll)."""
    turns = asyncio.Semaphore(concurrency)

    async def one(node: SwarmDHT) -> None:
        async with turns:
            await node.get_announcements(MODEL)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(n) for n in nodes))
    return time.perf_counter() - t0


async def lookups(nodes: list[SwarmDHT], rounds: int, want: set[str]) -> dict:
    """(a): every node looks up the model `rounds` times, one at a time, then all at once."""
    idle, idle_ok = [], 0
    cpu0 = tree_cpu_s()
    for _ in range(rounds):
        for node in nodes:
            took, found = await timed_lookup(node)
            idle.append(took)
            idle_ok += {a.peer_id for a in found} == want
    cpu_ms = (tree_cpu_s() - cpu0) * 1000.0 / len(idle)
    burst, burst_ok = [], 0
    for _ in range(rounds):
        for took, found in await asyncio.gather(*(timed_lookup(n) for n in nodes)):
            burst.append(took)
            burst_ok += {a.peer_id for a in found} == want
    return {
        "idle_ms": stats_ms(idle),
        "idle_complete": round(idle_ok / len(idle), 4),
        "idle_cpu_ms_per_lookup": round(cpu_ms, 1),
        "burst_ms": stats_ms(burst),
        "burst_complete": round(burst_ok / len(burst), 4),
    }


async def spread(nodes: list[SwarmDHT], change, seen, concurrency: int, deadline_s: float) -> dict:
    """Start `change()` and poll every node until `seen(announcements)` holds there.

    Every node polls in turn, `concurrency` lookups at a time (more would measure this machine's
    overload: 80 processes share 2 cores), so a node's time includes waiting for its turn.
    Returns:
        call_ms: how long `change()` took; first_s / last_s: from its start until the first / last node
        saw the change; missed_after_call: lookups started after `change()` returned that did not see it
        yet (of lookups_after_call); missing: nodes that had not seen it by the deadline.
    """
    t0 = time.perf_counter()
    when: dict[int, float] = {}
    call_done: list[float] = []
    after = {"lookups": 0, "missed": 0}
    turns = asyncio.Semaphore(concurrency)

    async def watch(i: int, node: SwarmDHT) -> None:
        while time.perf_counter() - t0 < deadline_s:
            async with turns:
                started_after_call = bool(call_done)
                ok = seen(await node.get_announcements(MODEL))
            after["lookups"] += started_after_call
            after["missed"] += started_after_call and not ok
            if ok:
                when[i] = time.perf_counter() - t0
                return

    watchers = [asyncio.create_task(watch(i, n)) for i, n in enumerate(nodes)]
    await change()
    call_done.append(time.perf_counter() - t0)
    await asyncio.gather(*watchers)
    times = sorted(when.values())
    return {
        "call_ms": round(call_done[0] * 1000.0, 1),
        "first_s": round(times[0], 3) if times else None,
        "last_s": round(times[-1], 3) if len(times) == len(nodes) else None,
        "missed_after_call": after["missed"],
        "lookups_after_call": after["lookups"],
        "missing": len(nodes) - len(times),
    }


async def trial(nodes: list[SwarmDHT], node: SwarmDHT, args: argparse.Namespace) -> dict:
    """(b) then (c) for one node that has no record yet."""
    pid = node.peer_id

    async def announce() -> None:
        await node.announce(span_record(node, 0, N_LAYERS), EXPIRATION_S)

    async def withdraw() -> None:
        await node.withdraw(MODEL)

    def listed(found: list[Announcement]) -> bool:
        return pid in {a.peer_id for a in found}

    up = await spread(nodes, announce, listed, args.concurrency, DEADLINE_S)
    down = await spread(nodes, withdraw, lambda found: not listed(found), args.concurrency, DEADLINE_S)
    return {"announce": up, "withdraw": down}


def summarize(rows: list[dict]) -> dict:
    """p50 / max over trials of one kind of change."""
    done = [r for r in rows if r["last_s"] is not None]
    seen = [r["first_s"] for r in rows if r["first_s"] is not None]
    return {
        "call_ms_p50": round(float(np.median([r["call_ms"] for r in rows])), 1),
        "first_s_p50": round(float(np.median(seen)), 3) if seen else None,
        "last_s_p50": round(float(np.median([r["last_s"] for r in done])), 3) if done else None,
        "last_s_max": max(r["last_s"] for r in done) if done else None,
        "missed_after_call": sum(r["missed_after_call"] for r in rows),
        "lookups_after_call": sum(r["lookups_after_call"] for r in rows),
        "trials_not_seen_by_all": len(rows) - len(done),
    }


async def run(args: argparse.Namespace, root: Path) -> dict:
    rng = random.Random(args.seed)
    t_start = time.perf_counter()
    out: dict = {"nodes": args.nodes, "announcers": args.announcers, "concurrency": args.concurrency}
    out["loadavg_start"] = loadavg()
    nodes = await start_nodes(args.nodes, root, rng)
    out["start_s"] = round(time.perf_counter() - t_start, 1)
    try:
        announcers = nodes[1 : 1 + args.announcers]
        bounds = np.linspace(0, N_LAYERS, len(announcers) + 1).round().astype(int)
        calls = []
        for node, a, b in zip(announcers, bounds[:-1], bounds[1:]):
            t0 = time.perf_counter()
            await node.announce(span_record(node, int(a), int(b)), EXPIRATION_S)
            calls.append(time.perf_counter() - t0)
        out["announce_call_idle_ms"] = stats_ms(calls)
        out["lookup"] = await lookups(nodes, args.lookups, {n.peer_id for n in announcers})
        sweeps = [await sweep_s(nodes, args.concurrency) for _ in range(args.lookups)]
        out["poll_sweep_s"] = round(float(np.median(sweeps)), 3)
        trials = []
        for node in rng.sample(nodes[1 + args.announcers :], args.trials):
            trials.append(await trial(nodes, node, args))
            print(f"  trial {len(trials)}: {json.dumps(trials[-1])}", file=sys.stderr)
        out["announce"] = summarize([t["announce"] for t in trials])
        out["withdraw"] = summarize([t["withdraw"] for t in trials])
    finally:
        await asyncio.gather(*(n.shutdown() for n in reversed(nodes)), return_exceptions=True)
    out["loadavg_end"] = loadavg()
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    return out


def table(out: dict) -> str:
    lk, idle = out["lookup"], out["announce_call_idle_ms"]
    rows = [
        f"real DHT: {out['nodes']} nodes on 127.0.0.1, {out['announcers']} announced spans "
        f"(started in {out['start_s']} s, whole run {out['total_s']} s, load {out['loadavg_start'][0]})",
        "| measure (ms) | p50 | p90 | max | lookups that found every span |",
        "|---|---|---|---|---|",
        f"| announce call, idle swarm | {idle['p50']} | {idle['p90']} | {idle['max']} | |",
    ]
    for name, key in (("lookup, one at a time", "idle"), ("lookup, all nodes at once", "burst")):
        ms = lk[f"{key}_ms"]
        rows.append(f"| {name} | {ms['p50']} | {ms['p90']} | {ms['max']} | {lk[f'{key}_complete']:.1%} |")
    rows += [
        f"CPU per idle lookup, summed over the swarm's processes: {lk['idle_cpu_ms_per_lookup']} ms",
        "",
        f"one polling sweep of every node ({out['concurrency']} lookups in flight): {out['poll_sweep_s']} s",
        "| change | call ms p50 | first node s p50 | last node s p50 / max | missed after call "
        "| not seen by all |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("announce", "withdraw"):
        r = out[kind]
        rows.append(
            f"| {kind} | {r['call_ms_p50']} | {r['first_s_p50']} | {r['last_s_p50']} / {r['last_s_max']} | "
            f"{r['missed_after_call']} of {r['lookups_after_call']} | {r['trials_not_seen_by_all']} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=40, help="DHT nodes, 30 to 50")
    ap.add_argument("--announcers", type=int, default=10, help="nodes that announce a span first")
    ap.add_argument("--lookups", type=int, default=3, help="lookups per node, idle and in a burst")
    ap.add_argument("--trials", type=int, default=5, help="announce + withdraw trials")
    ap.add_argument("--concurrency", type=int, default=4, help="lookups in flight while polling in (b), (c)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not 2 <= args.nodes <= 64 or args.announcers + args.trials >= args.nodes:
        ap.error("need 2..64 nodes and more nodes than announcers + trials")
    with tempfile.TemporaryDirectory(prefix="bench-dht-") as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    print(table(out), file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
