"""Live fuzz of a real serving peer while a normal client generates through it.

Starts one `swarm serve` peer holding the whole model (or attaches to a running one), runs a greedy
generation alone (the reference), then sends about --frames random and mutated frames from another
client node (tests/helpers/fuzzpeer.py: random bytes, mutated frames and fields, hostile frames in
valid sessions, push streams, truncated and huge-length frames, direct streams and raw TCP, idle
streams) while the normal client generates again and again, and once more after. Prints one JSON
object: frames sent (by kind), the peer's answers, peer restarts (0: the process stayed up), whether
every generation's text equals the reference, and the peer's RSS before, at most during, and after.
Exits 1 when the peer died or a text differed.

    python scripts/fuzz_peer.py --frames 5000 [--model smollm2] [--seed 0] [--tokens 24]
    python scripts/fuzz_peer.py --attach /ip4/127.0.0.1/tcp/PORT/p2p/ID --pid PID   # a running peer
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarm import Client  # noqa: E402
from swarm.client.loop import LoopThread  # noqa: E402
from swarm.dht.node import SwarmDHT  # noqa: E402
from swarm.ggml_bridge.slicing import read_span_layers  # noqa: E402
from swarm.manifest import build_manifest  # noqa: E402
from swarm.models import DEFAULT_MODEL, resolve_model  # noqa: E402

from tests.helpers.fuzzpeer import Target, fuzz_peer  # noqa: E402
from tests.helpers.peers import PeerSet, free_port, rss_bytes, scrape, serve_args, wait_for  # noqa: E402

PROMPT = "The three most useful things to know about a hash table are"


def target_of(dht: SwarmDHT, loop: LoopThread, model_id: str, n_embd: int, peer_id: str) -> Target:
    """The peer's announced addresses and span, read from the DHT."""
    def announced():
        return [a for a in loop.run(dht.get_announcements(model_id), 30) if a.peer_id == peer_id]

    (ann,) = wait_for(announced, f"{peer_id} announced")
    return Target(ann.peer_id, ann.addrs, ann.direct_addrs, model_id, ann.start, ann.end, n_embd)


def run(args, peer_maddrs: list[str], peer_id: str, pid: int | None, metrics_port: int | None,
        path: Path, tmp: Path) -> dict:
    manifest = build_manifest(path)
    out: dict = {"model": path.name, "frames_wanted": args.frames, "seed": args.seed}
    with Client(str(path), initial_peers=peer_maddrs) as client:
        reference = client.generate(PROMPT, max_new_tokens=args.tokens).text
        out["rss_before_mib"] = rss_bytes(pid) / 2**20 if pid else None
        loop = LoopThread()
        dht = loop.run(SwarmDHT.start(peer_maddrs, client_mode=True, data_dir=str(tmp)), 60)
        try:
            target = target_of(dht, loop, manifest.model_id, manifest.n_embd, peer_id)
            done = threading.Event()
            result: dict = {}

            def fuzz() -> None:
                try:
                    result["report"] = loop.run(fuzz_peer(dht.transport, target, args.frames, seed=args.seed))
                except BaseException as e:  # noqa: BLE001 - reported in the JSON
                    result["error"] = f"{type(e).__name__}: {e}"
                finally:
                    done.set()

            t0 = time.perf_counter()
            threading.Thread(target=fuzz, daemon=True).start()
            texts, peak = [], 0
            while not done.is_set():
                texts.append(client.generate(PROMPT, max_new_tokens=args.tokens).text)
                peak = max(peak, rss_bytes(pid)) if pid else 0
            fuzz_s = time.perf_counter() - t0
            texts.append(client.generate(PROMPT, max_new_tokens=args.tokens).text)  # after the fuzz
        finally:
            loop.run(dht.shutdown(), 30)
            loop.stop()
    report = result.get("report")
    out.update({
        "fuzz_error": result.get("error"),
        "frames_sent": report.frames if report else 0,
        "frames_by_kind": dict(report.by_kind) if report else {},
        "peer_answers": dict(report.replies) if report else {},
        "streams_closed_by_peer": report.closed if report else 0,
        "idle_streams": report.idle if report else 0,
        "fuzz_seconds": round(fuzz_s, 1),
        "generations_during_and_after": len(texts),
        "text_identical": all(t == reference for t in texts),
        "reference_text": reference,
        "rss_peak_during_mib": peak / 2**20 if pid else None,
        "rss_after_mib": rss_bytes(pid) / 2**20 if pid else None,
    })
    if metrics_port is not None:
        m = scrape(metrics_port)
        out["buffered_bytes_peak"] = m.get("swarm_peer_buffered_bytes_peak")
        out["buffered_bytes_budget"] = m.get("swarm_peer_buffered_bytes_budget")
        out["limit_refusals"] = {k: v for k, v in m.items() if k.startswith("swarm_peer_limit_refusals_total")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=3000, help="frames to send, about (default 3000)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=24, help="tokens per normal generation (default 24)")
    ap.add_argument("--attach", default=None, metavar="MADDR", help="fuzz this running peer (whole model)")
    ap.add_argument("--pid", type=int, default=None, help="with --attach: the peer's pid, for its RSS")
    args = ap.parse_args(argv)
    path = resolve_model(args.model, progress=True)
    with tempfile.TemporaryDirectory(prefix="fuzz-peer-") as tmp:
        if args.attach:
            peer_id = args.attach.rsplit("/p2p/", 1)[-1]
            out = run(args, [args.attach], peer_id, args.pid, None, path, Path(tmp))
            alive = args.pid is None or Path(f"/proc/{args.pid}").exists()
        else:
            ps = PeerSet(Path(tmp) / "peers")
            port = free_port()
            _, n_layers = read_span_layers(path)
            peer = ps.start("p0", *serve_args(path, f"0:{n_layers}", "--new-swarm", "--metrics-port", str(port)))
            try:
                out = run(args, peer.maddrs, peer.peer_id, peer.proc.pid, port, path, Path(tmp))
                alive = peer.proc.poll() is None
            finally:
                ps.stop_all()
        out["peer_restarts"] = 0 if alive else 1
    print(json.dumps(out, indent=1))
    return 0 if alive and out["text_identical"] and out["fuzz_error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
