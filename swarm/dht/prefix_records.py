"""Prefix holdings records: which token prefixes a peer holds KV snapshots of, for one span.

Each peer serving span [start, end) of a model stores one signed DHT blob (swarm/dht/node.py
`store_blob`: only the key's owner can write it) under `prefixes_key(model_id, start, end)`, name
`HOLDINGS_NAME`, whose value is msgpack of

    {"addrs": [multiaddr, ...], "held": [[n_tokens, sha256 chain hash], ...]}

most recently used first, at most MAX_HELD pairs (~38 B each, so under the 64 KiB blob cap).
The holder is the blob's owner (its signature is checked by the DHT validators); decoding is
bounded, forward-compatible (unknown fields ignored) and returns None for anything malformed.

This module is pure: no hivemind, no network, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from swarm.dht.records import MAX_ADDR_CHARS, MAX_ADDRS
from swarm.limits import PREFIX_HASH_BYTES as HASH_BYTES

HOLDINGS_NAME = "prefixes"
MAX_HELD = 512


def prefixes_key(model_id: str, start: int, end: int) -> str:
    """DHT key under which every holder of span [start, end) lists its prefixes (one blob each)."""
    return f"swarm/{model_id}/prefixes/{start}:{end}"


@dataclass(frozen=True)
class Holdings:
    """One peer's snapshot prefixes of one span.

    Attributes:
        peer_id: the holder (the blob's signing owner).
        addrs: its multiaddrs.
        held: (n_tokens, hash) pairs, most recently used first.
    """

    peer_id: str
    addrs: tuple[str, ...]
    held: tuple[tuple[int, bytes], ...]


def encode_holdings(addrs: list[str], held: list[tuple[int, bytes]]) -> bytes:
    """The blob value for `held` (cut to MAX_HELD) and `addrs` (cut to MAX_ADDRS)."""
    return msgpack.packb(
        {"addrs": list(addrs)[:MAX_ADDRS], "held": [[n, h] for n, h in held[:MAX_HELD]]}, use_bin_type=True
    )


def decode_holdings(peer_id: str, value: Any) -> Holdings | None:
    """A blob value from `peer_id` → Holdings, or None when malformed or oversized."""
    if not isinstance(value, bytes) or len(value) > 64 * 1024:
        return None
    try:
        rec = msgpack.unpackb(value, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises many types
        return None
    if not isinstance(rec, dict):
        return None
    addrs, held = rec.get("addrs"), rec.get("held")
    if (
        not isinstance(addrs, list)
        or len(addrs) > MAX_ADDRS
        or not isinstance(held, list)
        or len(held) > MAX_HELD
    ):
        return None
    if not all(isinstance(a, str) and 0 < len(a) <= MAX_ADDR_CHARS for a in addrs):
        return None
    pairs = []
    for p in held:
        if (
            not isinstance(p, list)
            or len(p) != 2
            or not isinstance(p[0], int)
            or isinstance(p[0], bool)
            or not 0 < p[0] <= 1 << 24
            or not isinstance(p[1], bytes)
            or len(p[1]) != HASH_BYTES
        ):
            return None
        pairs.append((p[0], p[1]))
    return Holdings(peer_id, tuple(addrs), tuple(pairs))
