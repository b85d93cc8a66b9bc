"""Generation over a WAN, in the network lab (sim/netlab.py; issue 23): decode tokens/s, TTFT and
the median inter-token latency at each round-trip time, next to the floor the route's message
pattern sets.

The swarm: a public DHT peer and three serving peers of the model's thirds (SmolLM2: 0:10, 10:20,
20:30), 1 thread each; a client behind a NAT router (masquerade, no port forward). Every two sites
are RTT apart (the delay line holds each site's link RTT/4 each way). The peers start once; for
each RTT the delay is set and the client (one process inside its site, `--client` mode of this
script) warms up with a short generation, then runs `--repeats` greedy generations of the same
prompt. Figures are the medians over those runs.

The floor: with server push a decode token crosses client -> hop 1 -> ... -> hop S -> client, S+1
one-way trips of RTT/2 each (docs/architecture.md, "Peers push, the client keeps the record"), so
it cannot come sooner than (S+1)/2 round trips after the one before it: 2 RTT over three hops. The
floor of the inter-token latency at an RTT is the 0 ms run's plus that.

Transports (`--transport`): `direct` (the serving peers in public sites: direct TCP streams, pushed
peer to peer); `relayed` (the middle serving peer behind a NAT router without forwards, reached by
the client and pushed into by the first peer through the DHT peer's relay: swarm.relay). A
transport is one function in TRANSPORTS that places and starts the serving peers and says how many
one-way trips a token crosses.

    flock /tmp/swarm-heavy.lock .venv/bin/python scripts/bench_wan.py [--rtt 0 20 50] [--decode 64] \
        [--repeats 3] [--transport direct relayed]

With several transports, their swarms stand side by side in one lab (apart: one DHT each) and at each
RTT their clients run back to back; with both `direct` and `relayed`, the output adds per RTT the
relayed route's inter-token latency minus the direct one's, next to one measured RTT.

Needs root (network namespaces); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.netlab import Lab, Site, lab_available  # noqa: E402 - the repo root is on sys.path now
from sim.netprobe import listen, ping  # noqa: E402
from swarm.manifest import build_manifest  # noqa: E402
from swarm.models import resolve_model  # noqa: E402
from tests.helpers.oracle import PROMPT  # noqa: E402
from tests.helpers.lab import start_in  # noqa: E402 - the tests' peer launcher, in a lab site
from tests.helpers.peers import PeerSet, serve_args  # noqa: E402

CLIENT_S = 900.0
PROBE_PORT = 7999


@dataclass(frozen=True)
class Placed:
    """A transport's swarm, ready for a client.

    Attributes:
        initial_peers: multiaddrs the client joins through.
        first_hop: the site of the route's first serving peer (its RTT to the client is probed).
        one_way_trips: one-way trips of RTT/2 per decode token on this transport's route.
    """

    initial_peers: list[str]
    first_hop: Site
    one_way_trips: int


def direct(lab: Lab, peers: PeerSet, model: Path, n_layers: int, tag: str) -> Placed:
    """Three serving peers in public sites, joined through a public DHT peer: every hop direct, and
    pushed peer to peer (S + 1 = 4 one-way trips per token). Sites and peers are named `tag`-NAME."""
    dht = start_in(peers, lab, lab.public(f"{tag}-dht"), f"{tag}-dht", "dht", ready_marker="")
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    sites = [lab.public(f"{tag}-p{i}") for i in range(3)]
    for i, site in enumerate(sites):
        start_in(
            peers,
            lab,
            site,
            site.name,
            *serve_args(model, f"{cuts[i]}:{cuts[i + 1]}", "--initial-peers", dht.maddrs[0]),
        )
    return Placed(dht.maddrs, sites[0], len(sites) + 1)


def relayed(lab: Lab, peers: PeerSet, model: Path, n_layers: int, tag: str) -> Placed:
    """The middle serving peer behind a NAT router without forwards (`--reachability private`), reached
    through the public DHT peer's relay (swarm.relay); the other two public. The trips into and out of
    the middle hop each pass the relay's site: S + 1 + 2 = 6 one-way trips per token, one RTT more
    than direct. Sites and peers are named `tag`-NAME."""
    dht = start_in(peers, lab, lab.public(f"{tag}-dht"), f"{tag}-dht", "dht", ready_marker="")
    cuts = [0, n_layers // 3, 2 * n_layers // 3, n_layers]
    sites = [lab.public(f"{tag}-p0"), lab.home(f"{tag}-p1"), lab.public(f"{tag}-p2")]
    for i, site in enumerate(sites):
        private = ("--reachability", "private") if site.router is not None else ()
        start_in(peers, lab, site, site.name,
                 *serve_args(model, f"{cuts[i]}:{cuts[i + 1]}", "--initial-peers", dht.maddrs[0], *private))
    return Placed(dht.maddrs, sites[0], len(sites) + 1 + 2)


TRANSPORTS: dict[str, Callable[[Lab, PeerSet, Path, int, str], Placed]] = {"direct": direct, "relayed": relayed}


def run_client(model: str, initial_peers: list[str], prompt: str, n_decode: int, repeats: int) -> list[dict]:
    """Inside the client's site: one warm-up generation, then `repeats` measured ones (one Client)."""
    from swarm import Client

    runs = []
    with Client(model, initial_peers=initial_peers) as client:
        client.generate(prompt[:40], max_new_tokens=4)  # probes, streams and cost model warmed
        for _ in range(repeats):
            got = client.generate(prompt, max_new_tokens=n_decode + 1)
            t = got.telemetry
            runs.append(
                {
                    "text": got.text,
                    "ttft_ms": t.ttft_ms,
                    "decode_tok_s": t.decode_tokens_per_s,
                    "itl_ms_p50": statistics.median(t.token_latencies_ms[1:]),
                    "transports": [h.transport for h in t.route],
                    "pushed_steps": [h.pushed_steps for h in t.route],
                    "compute_ms_per_token": sum(h.compute_ms for h in t.route) / max(1, t.generated_tokens),
                }
            )
    return runs


def run_one(lab: Lab, client_site: Site, placed: Placed, model: Path, rtt: float, args) -> dict:
    """One row: probe the client's RTT to the first hop, run the client (warm-up + repeats) at the RTT
    set now."""
    probe = ping(lab, client_site, placed.first_hop.address, PROBE_PORT, count=10)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--client",
        str(model),
        "--decode",
        str(args.decode),
        "--repeats",
        str(args.repeats),
        "--initial-peers",
        *placed.initial_peers,
    ]
    runs = json.loads(lab.run(client_site, argv, timeout_s=CLIENT_S).stdout.strip().splitlines()[-1])
    return {
        "rtt_ms": rtt,
        "measured_rtt_ms_p50": round(statistics.median(probe.rtt_ms), 2),
        "decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in runs), 2),
        "ttft_ms": round(statistics.median(r["ttft_ms"] for r in runs), 1),
        "itl_ms_p50": round(statistics.median(r["itl_ms_p50"] for r in runs), 1),
        "compute_ms_per_token": round(statistics.median(r["compute_ms_per_token"] for r in runs), 1),
        "transports": runs[0]["transports"],
        "pushed_steps": runs[0]["pushed_steps"],
        "texts": sorted({r["text"] for r in runs}),
    }


def measure(lab: Lab, client_site: Site, placed: dict[str, Placed], model: Path, args) -> dict[str, list[dict]]:
    """For each RTT: set it, then run every transport's client back to back (so transports share the
    machine's load of the moment); {transport: one row per RTT}, with the floor and the added latency
    over the transport's own 0 ms row."""
    rows: dict[str, list[dict]] = {name: [] for name in placed}
    for p in placed.values():
        listen(lab, p.first_hop, PROBE_PORT)
    for rtt in args.rtt:
        lab.set_rtt(rtt)
        for name, p in placed.items():
            rows[name].append(run_one(lab, client_site, p, model, rtt, args))
    for name, p in placed.items():
        base = rows[name][0]["itl_ms_p50"] if args.rtt[0] == 0 else None
        for row in rows[name]:
            row["floor_added_ms"] = p.one_way_trips * row["rtt_ms"] / 2
            if base is not None:
                row["added_itl_ms"] = round(row["itl_ms_p50"] - base, 1)
                row["floor_itl_ms"] = round(base + row["floor_added_ms"], 1)
    return rows


def relayed_minus_direct(rows: dict[str, list[dict]]) -> list[dict]:
    """Per RTT, the relayed route's inter-token latency minus the direct one's (both of this run), next
    to one measured RTT (the most one relayed hop may add per token: issue 23's acceptance)."""
    out = []
    for d, r in zip(rows["direct"], rows["relayed"]):
        diff = round(r["itl_ms_p50"] - d["itl_ms_p50"], 1)
        one_rtt = d["measured_rtt_ms_p50"]
        out.append({"rtt_ms": d["rtt_ms"], "itl_diff_ms": diff, "one_rtt_ms": one_rtt,
                    "within_one_rtt": diff <= one_rtt if d["rtt_ms"] > 0 else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--rtt", type=float, nargs="+", default=[0.0, 20.0, 50.0], help="ms; start with 0 for the floor"
    )
    ap.add_argument("--decode", type=int, default=64, help="decode steps per generation")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transport", choices=sorted(TRANSPORTS), nargs="+", default=["direct"],
                    help="one or more; several are measured in one lab, back to back at each RTT")
    ap.add_argument("--client", metavar="MODEL", help=argparse.SUPPRESS)  # the client inside its site
    ap.add_argument("--initial-peers", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        print(json.dumps(run_client(args.client, args.initial_peers, PROMPT, args.decode, args.repeats)))
        return 0
    reason = lab_available()
    if reason:
        raise SystemExit(f"bench_wan: {reason}")
    model = resolve_model(args.model, fetch=True)
    n_layers = build_manifest(model).n_layers
    with tempfile.TemporaryDirectory(prefix="bench-wan-") as root, Lab() as lab:
        peers = PeerSet(Path(root))
        try:
            placed = {name: TRANSPORTS[name](lab, peers, model, n_layers, name[0]) for name in args.transport}
            client_site = lab.home("client")
            rows = measure(lab, client_site, placed, model, args)
        finally:
            peers.stop_all()
    texts = {t for by in rows.values() for row in by for t in row.pop("texts")}
    out = {
        "model": args.model,
        "decode": args.decode,
        "repeats": args.repeats,
        "same_text_everywhere": len(texts) == 1,
        "rows": rows,
    }
    if {"direct", "relayed"} <= rows.keys():
        out["relayed_minus_direct"] = relayed_minus_direct(rows)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
