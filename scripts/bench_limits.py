"""Limits per client on a real peer: a modest client's speed next to a greedy one, and the peer's
memory under concurrent huge frames.

One `swarm serve` peer holds the whole model (default limits, 8 session slots, metrics on), or with
`--spans 3` three peers hold its thirds, as on a swarm, and the greedy client loads the middle one.

  fairness: a modest client's greedy generation (TTFT and decode tokens/s, from its Generation
            Telemetry) on the idle peer, then while a greedy client holds 32 streams on the peer
            (16 are refused at its stream limit; of the 16 held, 4 get sessions, the rest BUSY at
            its session limit) and keeps its 4 sessions busy: `--load decode` steps them one token
            at a time, `--load prefill` sends them 256-row prefills over and over; the modest
            client starts once the greedy one has kept its load up for `--greedy-s` seconds (a hog
            that was there first). Prints the ratios loaded / idle (target: within 1.5x; with
            `--repeats`, the median of the pairs too), the greedy client's answers by reason, its
            steps while the modest client ran, the scheduler's holds (units held back for the
            modest client's due steps) and the greedy chunks stopped for it (and their lost ms).
  frames:   24 frames of 60 MiB sent at once from 6 clients (4 streams each): the peer's RSS before,
            at most during (sampled) and after, the most frame bytes it held in flight (its metric),
            and the answers (PROTOCOL: read and refused as a malformed frame; BUSY: refused unread
            at a client's byte budget).

    python scripts/bench_limits.py [--model smollm2] [--tokens 32] [--load decode|prefill|both] [--greedy-s 10] \
        [--spans 1|3] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm import Client  # noqa: E402
from swarm.errors import SwarmError  # noqa: E402
from swarm.ggml_bridge.slicing import read_span_layers  # noqa: E402
from swarm.manifest import build_manifest  # noqa: E402
from swarm.models import DEFAULT_MODEL, resolve_model  # noqa: E402
from swarm.wire import Error, Forward, OpenOk, decode_frame, encode_frame  # noqa: E402

from tests.helpers.peers import PeerSet, RawClient, free_port, rss_bytes, scrape, serve_args  # noqa: E402

PROMPT = ", ".join(str(i) for i in range(1, 61)) + ","  # ~120 tokens, and the model keeps counting


def fresh(tmp: Path, name: str) -> Path:
    """A new directory for one client node's identity."""
    (tmp / name).mkdir()
    return tmp / name


def modest_run(path: Path, maddrs: list[str], tokens: int) -> dict:
    with Client(str(path), initial_peers=maddrs) as client:
        client.generate(PROMPT, max_new_tokens=4)  # warm-up: connections, RTT probes
        g = client.generate(PROMPT, max_new_tokens=tokens)
    t = g.telemetry
    return {"ttft_ms": round(t.ttft_ms, 1), "decode_tokens_per_s": round(t.decode_tokens_per_s, 1),
            "generated_tokens": t.generated_tokens, "failovers": len(t.failovers), "text": g.text}


def answer(c: RawClient, stream, frame: bytes):
    try:
        return c.ask(stream, frame)
    except SwarmError:
        return decode_frame(c.loop.run(stream.last_words(), 30))


async def hammer(sessions, stop: threading.Event, n_embd: int, load: str, steps: list) -> None:
    rng = np.random.default_rng(0)
    rows = (0.1 * rng.standard_normal((256 if load == "prefill" else 1, n_embd))).astype(np.float32)

    async def one(s) -> None:
        pos = 0
        while not stop.is_set():
            if pos + len(rows) > 512:
                pos = 0
            await s.send(encode_frame(Forward(step=len(steps), pos0=pos, hidden=rows, rewind=True)))
            decode_frame(await s.recv(120))
            pos += len(rows)
            steps.append(1)

    await asyncio.gather(*(one(s) for s in sessions))


def fairness(path: Path, peer, span: tuple[int, int], entry: list[str], port: int, tmp: Path, tokens: int,
             load: str, greedy_s: float, repeat: int = 0) -> dict:
    """The modest client's generation (through `entry`, the first peer's addresses) idle, then while a
    greedy client loads `peer`, which serves layers `span`."""
    idle = modest_run(path, entry, tokens)
    greedy = RawClient(peer, build_manifest(path).model_id, fresh(tmp, f"greedy-{load}-{repeat}"))
    try:
        streams = [greedy.stream() for _ in range(32)]
        answers = [answer(greedy, s, greedy.open_frame(max_tokens=512, span=span)) for s in streams]
        sessions = [s for s, a in zip(streams, answers) if isinstance(a, OpenOk)]
        reasons = Counter(a.message.split("(")[-1].rstrip(")") if isinstance(a, Error) else "open_ok"
                          for a in answers)
        stop, steps = threading.Event(), []
        fut = asyncio.run_coroutine_threadsafe(
            hammer(sessions, stop, build_manifest(path).n_embd, load, steps), greedy.loop.loop)
        t0 = time.monotonic()
        while len(steps) < 8 or time.monotonic() - t0 < greedy_s:
            if fut.done():  # the load stopped by itself: say why instead of waiting forever
                fut.result()
                raise SystemExit(f"the greedy client's load stopped: its Opens were answered {dict(reasons)}")
            time.sleep(0.05)
        counters = ("swarm_peer_scheduler_held_ms_total", "swarm_peer_scheduler_preemptions_total",
                    "swarm_peer_scheduler_preempted_ms_total")
        before, m = len(steps), scrape(port)
        at_start = [m[c] for c in counters]
        try:
            loaded = modest_run(path, entry, tokens)
            during = len(steps) - before
            m = scrape(port)
            held_ms, stops, stopped_ms = (m[c] - a for c, a in zip(counters, at_start))
        finally:
            stop.set()
            fut.result(300)
        for s in streams:
            greedy.loop.run(s.close(), 30)
    finally:
        greedy.close()
    return {
        "load": load,
        "greedy_answers": dict(reasons),
        "greedy_steps_during_modest": during,
        "held_ms_during_modest": round(held_ms, 1),
        "greedy_chunks_stopped_during_modest": int(stops),
        "stopped_chunks_ms": round(stopped_ms, 1),
        "idle": {k: v for k, v in idle.items() if k != "text"},
        "loaded": {k: v for k, v in loaded.items() if k != "text"},
        "ttft_ratio": round(loaded["ttft_ms"] / max(idle["ttft_ms"], 1e-9), 2),
        "tokens_per_s_ratio": round(idle["decode_tokens_per_s"] / max(loaded["decode_tokens_per_s"], 1e-9), 2),
        "text_identical": loaded["text"] == idle["text"],
    }



def frames(peer, port: int, tmp: Path) -> dict:
    clients = [RawClient(peer, "00", fresh(tmp, f"flood{i}")) for i in range(6)]
    try:
        before = rss_bytes(peer.proc.pid)
        t0 = time.perf_counter()
        futs = [asyncio.run_coroutine_threadsafe(c.flood(4, 60 << 20, timeout_s=300), c.loop.loop) for c in clients]
        peak = before
        while not all(f.done() for f in futs):
            peak = max(peak, rss_bytes(peer.proc.pid))
            time.sleep(0.02)
        answers = [a for f in futs for a in f.result()]
        seconds = time.perf_counter() - t0
        after = rss_bytes(peer.proc.pid)
    finally:
        for c in clients:
            c.close()
    m = scrape(port)
    return {
        "frames": len(answers),
        "frame_mib": 60,
        "seconds": round(seconds, 1),
        "rss_before_mib": round(before / 2**20),
        "rss_peak_mib": round(peak / 2**20),
        "rss_after_mib": round(after / 2**20),
        "buffered_bytes_peak_mib": m["swarm_peer_buffered_bytes_peak"] / 2**20,
        "buffered_bytes_budget_mib": m["swarm_peer_buffered_bytes_budget"] / 2**20,
        "answers": dict(Counter(f"{a.code.value}: {a.message.split('(')[-1].rstrip(')')}"
                                if isinstance(a, Error) and a.code.value == "busy" else
                                a.code.value if isinstance(a, Error) else repr(a) for a in answers)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--load", choices=("decode", "prefill", "both"), default="both")
    ap.add_argument("--greedy-s", type=float, default=10.0,
                    help="seconds of greedy load before the modest client")
    ap.add_argument("--skip-frames", action="store_true")
    ap.add_argument("--repeats", type=int, default=1,
                    help="idle/loaded pairs per load (this VM's speed drifts 10-30%% between minutes: "
                         "read the median ratio)")
    ap.add_argument("--spans", type=int, default=1,
                    help="peers the model is cut into (1: one peer holds it whole); the greedy client "
                         "loads the middle one, which every route of the modest client goes through")
    args = ap.parse_args(argv)
    path = resolve_model(args.model, progress=True)
    out: dict = {"model": path.name, "tokens": args.tokens}
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        ps = PeerSet(Path(tmp) / "peers")
        port = free_port()
        _, n_layers = read_span_layers(path)
        cuts = [n_layers * i // args.spans for i in range(args.spans + 1)]
        loaded_at = args.spans // 2  # the peer the greedy client loads: the middle one of a route
        peers = []
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            join = ("--new-swarm",) if i == 0 else ("--initial-peers", peers[0].maddrs[0])
            metrics = ("--metrics-port", str(port)) if i == loaded_at else ()
            peers.append(ps.start(f"p{i}", *serve_args(path, f"{a}:{b}", *join, "--max-sessions", "8", *metrics)))
        peer = peers[loaded_at]
        out["spans"] = [f"{a}:{b}" for a, b in zip(cuts, cuts[1:])]
        out["loaded_span"] = out["spans"][loaded_at]
        try:
            loads = ("decode", "prefill") if args.load == "both" else (args.load,)
            span = (cuts[loaded_at], cuts[loaded_at + 1])
            out["fairness"] = [fairness(path, peer, span, list(peers[0].maddrs), port, Path(tmp), args.tokens,
                                        load, args.greedy_s, r)
                               for load in loads for r in range(args.repeats)]
            out["median_ratios"] = {
                load: {k: float(np.median([f[k] for f in out["fairness"] if f["load"] == load]))
                       for k in ("ttft_ratio", "tokens_per_s_ratio")} for load in loads}
            out["client_wait_units_max"] = scrape(port)["swarm_peer_client_wait_units_max"]
            if not args.skip_frames:
                out["frames"] = frames(peer, port, Path(tmp))
            out["peer_up"] = peer.proc.poll() is None
        finally:
            ps.stop_all()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
