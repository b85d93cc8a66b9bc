"""A stranger floods one model's spans key with signed junk subkeys: what the DHT keeps, what a reader gets.

Starts `--nodes` (default 3) real DHT nodes on 127.0.0.1, once with hivemind's own storage behind
swarm's validators (the code before swarm/dht/storage.py) and once as `SwarmDHT` starts them (bounded
storage). A stranger (a plain hivemind DHT client with its own RSA key, as issue 24 did) stores
`--subkeys` (default 20,000) blobs of `--bytes` (1,000) each, signed, under one key, in batches of
1,000. Reported per run: subkeys accepted, and for each storing node the subkeys it holds and the bytes
it sends a reader asking for the key (hivemind serializes the stored dictionary whole; past its
4 MiB message limit the answer fails and the reader gets nothing from that node), and what a reader's
`get` returned. Prints a table on stderr and one JSON line on stdout.

    python scripts/bench_dht_flood.py [--subkeys 20000] [--bytes 1000] [--nodes 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.dht.identity import load_or_create_identity
from swarm.dht.node import SwarmDHT
from swarm.dht.validation import SwarmRecordValidator

KEY = "swarm/" + "f1" * 16 + "/spans"
BATCH = 1000


async def _store(names: range, marker: bytes, size: int, _dht, node) -> int:
    subkeys = [b"blob:junk%d" % i + marker for i in names]
    ok = await node.store_many([KEY] * len(subkeys), [b"j" * size] * len(subkeys), get_dht_time() + 300,
                               subkeys=subkeys)
    return sum(bool(x) for x in ok.values())


async def _held(_dht, node) -> tuple[int, int]:
    item = node.protocol.storage.get(DHTID.generate(source=KEY))
    if item is None:
        return 0, 0
    return len(list(item.value.items())), len(MSGPackSerializer.dumps(item.value))


def plain_nodes(n: int, root: Path) -> list[hivemind.DHT]:
    """hivemind DHT nodes with swarm's validators and hivemind's own (unbounded) storage."""
    nodes: list[hivemind.DHT] = []
    for i in range(n):
        ident = load_or_create_identity(root / f"plain{i}")
        validators = [RSASignatureValidator(ident.private_key), SwarmRecordValidator()]
        peers = [str(m) for m in nodes[0].get_visible_maddrs()] if nodes else []
        nodes.append(hivemind.DHT(initial_peers=peers, start=True, record_validators=validators))
    return nodes


def flood(nodes: list[hivemind.DHT], args: argparse.Namespace, root: Path) -> dict:
    signer = RSASignatureValidator(load_or_create_identity(root / "stranger").private_key)
    peers = [str(m) for m in nodes[0].get_visible_maddrs()]
    stranger = hivemind.DHT(initial_peers=peers, start=True, client_mode=True, record_validators=[signer])
    t0, accepted = time.perf_counter(), 0
    try:
        for first in range(0, args.subkeys, BATCH):
            names = range(first, min(first + BATCH, args.subkeys))
            accepted += stranger.run_coroutine(functools.partial(_store, names, signer.local_public_key, args.bytes))
        flood_s = time.perf_counter() - t0
        reader = hivemind.DHT(initial_peers=peers, start=True, client_mode=True,
                              record_validators=[RSASignatureValidator()])  # strips signatures
        try:
            got = reader.get(KEY, latest=True)
        finally:
            reader.shutdown()
    finally:
        stranger.shutdown()
    held = [node.run_coroutine(_held) for node in nodes]
    return {
        "accepted": accepted,
        "flood_s": round(flood_s, 1),
        "held_per_node": [{"subkeys": n, "bytes": b} for n, b in held],
        "reader_got_subkeys": 0 if got is None else len(got.value),
    }


async def bounded_nodes(n: int, root: Path) -> list[SwarmDHT]:
    nodes: list[SwarmDHT] = []
    for i in range(n):
        peers = nodes[0].visible_maddrs() if nodes else []
        nodes.append(await SwarmDHT.start(peers, data_dir=root / f"bounded{i}"))
    return nodes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subkeys", type=int, default=20_000)
    ap.add_argument("--bytes", type=int, default=1000, help="value bytes per junk subkey")
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    out = {"subkeys": args.subkeys, "bytes": args.bytes, "nodes": args.nodes}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = plain_nodes(args.nodes, root)
        try:
            out["hivemind_storage"] = flood(plain, args, root)
        finally:
            for node in plain:
                node.shutdown()
        loop = asyncio.new_event_loop()
        bounded = loop.run_until_complete(bounded_nodes(args.nodes, root))
        try:
            out["bounded_storage"] = flood([b._dht for b in bounded], args, root)  # noqa: SLF001
        finally:
            for node in bounded:
                loop.run_until_complete(node.shutdown())
            loop.close()
    for name in ("hivemind_storage", "bounded_storage"):
        r = out[name]
        held = ", ".join(f"{h['subkeys']} / {h['bytes'] / 1e6:.2f} MB" for h in r["held_per_node"])
        print(f"{name:17s} accepted {r['accepted']:6d} in {r['flood_s']:5.1f} s; held per node: {held}; "
              f"a reader got {r['reader_got_subkeys']} subkeys", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
