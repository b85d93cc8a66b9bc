"""Loopback throughput of a span fetch: Qwen2.5-Coder-0.5B layers [0, 12) from one seeder.

Prints one JSON object: bytes wanted/downloaded, overfetch ratio, seconds and MiB/s. Both
libtorrent sessions run in this process on 127.0.0.1 (uTP, DHT, LSD, UPnP, NAT-PMP off).

    python scripts/bench_artifacts.py [--model qwen2.5-coder-0.5b] [--start 0 --end 12]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from swarm.artifacts.plan import span_byte_ranges
from swarm.artifacts.session import ArtifactSession
from swarm.artifacts.torrent import make_torrent
from swarm.manifest import build_manifest
from swarm.models import resolve_model


def time_fresh_peer(path: Path, start: int, end: int) -> dict:
    """Seconds from starting `swarm serve --model <model_id>` (no local file) to its announcement."""
    from swarm.localswarm import PeerSet

    model_id = build_manifest(path).model_id
    with tempfile.TemporaryDirectory() as root:
        peers = PeerSet(Path(root))
        try:
            pub = peers.start("publisher", "publish", str(path), "--new-swarm", ready_marker="publishing")
            t0 = time.monotonic()
            fresh = peers.start("fresh", "serve", "--model", model_id, "--layers", f"{start}:{end}",
                                "--threads", "1", "--initial-peers", pub.maddrs[0])
            elapsed = time.monotonic() - t0
            fetched = [ln for ln in fresh.stderr_text().splitlines() if "fetched" in ln and " in " in ln]
        finally:
            peers.stop_all()
    return {"start_to_announce_s": round(elapsed, 2), "fetch_log": fetched[-1].split(": ", 1)[-1] if fetched else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--end", type=int, default=12)
    ap.add_argument("--no-serve", action="store_true", help="skip the fresh `swarm serve` timing")
    args = ap.parse_args()
    path = resolve_model(args.model)
    t0 = time.monotonic()
    manifest = build_manifest(path)
    t_manifest = time.monotonic() - t0
    t0 = time.monotonic()
    torrent = make_torrent(path, manifest)
    t_torrent = time.monotonic() - t0
    ranges = span_byte_ranges(manifest, args.start, args.end, need_embd=False, need_head=False)
    needed = sum(n for _, n in ranges)
    with ArtifactSession() as seeder, ArtifactSession() as fetcher, tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        seeder.seed(path, torrent.data)
        t_seed = time.monotonic() - t0
        result = fetcher.fetch(
            torrent.data, manifest, Path(tmp) / "model.gguf", ranges, [seeder.address], progress=False
        )
    serve = None if args.no_serve else time_fresh_peer(path, args.start, args.end)
    print(
        json.dumps(
            {
                "model": args.model,
                "fresh_serve": serve,
                "span": [args.start, args.end],
                "piece_bytes": torrent.piece_size,
                "needed_bytes": needed,
                "wanted_bytes": result.wanted_bytes,
                "downloaded_bytes": result.downloaded_bytes,
                "overfetch_ratio": round(result.downloaded_bytes / needed, 4),
                "fetch_s": round(result.elapsed_s, 3),
                "fetch_MiB_per_s": round(result.downloaded_bytes / result.elapsed_s / 2**20, 1),
                "manifest_s": round(t_manifest, 3),
                "make_torrent_s": round(t_torrent, 3),
                "seed_check_s": round(t_seed, 3),
                "torrent_bytes": len(torrent.data),
            }
        )
    )


if __name__ == "__main__":
    main()
