"""What UPnP port mapping costs a peer's start, in the network lab (sim/netlab.py, sim/upnplab.py).

A public DHT peer, and two home sites behind NAT routers: `plain` (no UPnP) and `upnp` (miniupnpd).
In each home a `swarm serve` of SmolLM2's 30 layers starts with `--port-mapping auto` and with
`--port-mapping off`, `--repeats` times each; the figure is the time from launching the process to
its "serving layers" line (model load, DHT join, dial-back probe, relay registration when private,
announcement), median over the repeats. Without a router, auto costs the SSDP search's wait,
overlapped with the DHT node's start; with one, auto maps the ports and the peer is public, while
off leaves it private (a relay registration instead).

Also timed alone, inside each home site: the search (portmap.DISCOVER_MS) and mapping three ports
(`PortMapper.map`), and deleting them (`close`).

    flock /tmp/swarm-heavy.lock .venv/bin/python scripts/bench_portmap.py [--repeats 2]

Needs root (network namespaces) and miniupnpd; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.netlab import Lab, lab_available  # noqa: E402 - the repo root is on sys.path now
from sim.upnplab import enable_upnp, upnp_available  # noqa: E402
from swarm.models import resolve_model  # noqa: E402
from tests.helpers.lab import start_in  # noqa: E402 - the tests' peer launcher, in a lab site
from tests.helpers.peers import PeerSet, serve_args  # noqa: E402

MAPPED_PORTS = (41001, 41002, 41003)


async def _time_mapper(host: str) -> dict:
    """Run inside a home site (`--mapper HOST`): the search + three mappings, then their deletion, s."""
    from swarm.portmap import PortMapper
    from swarm.portmap_rules import ports_to_map

    mapper = PortMapper()
    t0 = time.perf_counter()
    mapper.start_discovery()
    words = await mapper.map(host, ports_to_map(*MAPPED_PORTS), "bench")
    t1 = time.perf_counter()
    await mapper.close()
    return {"discover_and_map_s": round(t1 - t0, 3), "delete_s": round(time.perf_counter() - t1, 3),
            "result": words}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mapper", help=argparse.SUPPRESS)  # internal: time PortMapper inside a site
    args = ap.parse_args()
    if args.mapper:
        print(json.dumps(asyncio.run(_time_mapper(args.mapper))))
        return
    why = lab_available() or upnp_available()
    if why:
        sys.exit(f"bench_portmap: {why}")
    model = resolve_model("smollm2-135m")
    out: dict = {"model": "smollm2-135m", "repeats": args.repeats, "start_s": {}, "mapper": {}}
    with Lab() as lab, tempfile.TemporaryDirectory() as tmp:
        dht_site = lab.public("dht")
        homes = {"plain": lab.home("plain"), "upnp": lab.home("upnp")}
        enable_upnp(lab, homes["upnp"])
        peers = PeerSet(Path(tmp))
        try:
            dht = start_in(peers, lab, dht_site, "dht", "dht", ready_marker="")
            for name, home in homes.items():
                argv = [sys.executable, str(Path(__file__).resolve()), "--mapper", home.address]
                done = lab.run(home, argv)
                out["mapper"][name] = json.loads(done.stdout.strip().splitlines()[-1])
                for mode in ("auto", "off"):
                    runs = []
                    for i in range(args.repeats):
                        t0 = time.perf_counter()
                        peer = start_in(peers, lab, home, f"{name}-{mode}-{i}", *serve_args(
                            model, "0:30", "--initial-peers", dht.maddrs[0], "--port-mapping", mode))
                        runs.append(time.perf_counter() - t0)
                        reach = peer.stderr_text().split("; reachability ", 1)[1].split(" ", 1)[0]
                        peer.stop()
                    out["start_s"][f"{name} router, --port-mapping {mode}"] = {
                        "median_s": round(statistics.median(runs), 2), "runs_s": [round(r, 2) for r in runs],
                        "reachability": reach}
        finally:
            peers.stop_all()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
