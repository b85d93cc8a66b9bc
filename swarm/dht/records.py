"""Announcement records: what a peer serving a layer span publishes in the DHT, and their bounded codec.

A record is a msgpack-able dict. Decoding is forward-compatible (unknown fields are ignored) and bounded
(string and list lengths, numeric ranges, 0 <= start < end <= MAX_LAYER); anything else is malformed.
The same pydantic schema checks records at store time (swarm.dht.validation) and on read.

This module is pure: no hivemind, no network, no clocks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pydantic.v1 as pydantic
from pydantic.v1 import confloat, conint, conlist, constr

from swarm.errors import ProtocolError
from swarm.limits import MAX_ADDR_CHARS, MAX_LAYERS

MAX_LAYER = MAX_LAYERS
"""Largest span end an announcement may name (limits.MAX_LAYERS, which bounds a model too)."""
MAX_ADDRS = 16
MAX_PUBLIC_NAME_CHARS = 64
MAX_RATE = 1e9
"""Upper bound for tokens/s figures and DHT times; larger is a lie or a bug."""

ANNOUNCE_SUBKEY_TAG = b"span"
"""Announcement subkeys are this tag followed by the owner's `[owner:ssh-rsa ...]` marker."""
BLOB_SUBKEY_TAG = b"blob:"
"""Blob subkeys are this tag, the caller's name, then the owner marker."""
MAX_BLOB_NAME_BYTES = 128
MAX_BLOB_BYTES = 64 * 1024


def announcements_key(model_id: str) -> str:
    """DHT key under which every peer serving `model_id` announces its span (one subkey per peer)."""
    return f"swarm/{model_id}/spans"


@dataclasses.dataclass(frozen=True)
class Announcement:
    """One peer's offer to run layers [start, end) of one model.

    Attributes:
        peer_id: base58 libp2p peer id; must be the id of the key that signs the record.
        addrs: multiaddr strings the peer listens on, at most MAX_ADDRS.
        model_id: hex id of the model (swarm.manifest).
        start, end: global half-open layer span, 0 <= start < end <= MAX_LAYER.
        decode_steps_per_s: measured decode throughput of the span, steps/s.
        prefill_tokens_per_s: measured prefill throughput, tokens/s.
        free_cache_tokens: KV-cache tokens still free.
        max_sessions, sessions_free: session slots in total and free now.
        version: software version string.
        protocol: stream protocol generation.
        public_name: optional display name, at most MAX_PUBLIC_NAME_CHARS.
        expires_at: DHT time (seconds, hivemind.get_dht_time) after which the record is void.
        started_at: Unix time this run of the peer started serving; a restart announces a new value,
            which tells clients that a peer they saw fail is back (0.0 in records of older peers).
        direct_addrs: TCP multiaddrs of the peer's direct-stream listener (swarm.direct), at most
            MAX_ADDRS; empty when it offers none (and in records of older peers).
        relay_addrs: where a peer that cannot be dialled is reached through a relay
            (swarm.relay.records.relay_addr: the relay's TCP endpoint and peer id), at most MAX_ADDRS;
            empty for a reachable peer (and in records of older peers).
        client_sessions, client_kv_tokens, client_streams, client_bytes: what one client may hold on
            the peer (`swarm.peer.quotas.ClientLimits`): sessions, reserved KV tokens, open streams,
            frame bytes in flight; 0 in records of older peers (not announced).
        max_streams, max_buffered_bytes: the peer's caps over all clients; 0 when not announced.
        reachability: what the peer learned of its own reachability from outside (swarm.reach):
            "public" (another peer dialled it back), "private" (dial-backs failed: behind a NAT
            or firewall with no forward) or "unknown" (not probed; also in records of older peers).
    """

    peer_id: str
    addrs: tuple[str, ...]
    model_id: str
    start: int
    end: int
    decode_steps_per_s: float
    prefill_tokens_per_s: float
    free_cache_tokens: int
    max_sessions: int
    sessions_free: int
    version: str
    protocol: int
    public_name: Optional[str]
    expires_at: float
    started_at: float = 0.0
    direct_addrs: tuple[str, ...] = ()
    relay_addrs: tuple[str, ...] = ()
    client_sessions: int = 0
    client_kv_tokens: int = 0
    client_streams: int = 0
    client_bytes: int = 0
    max_streams: int = 0
    max_buffered_bytes: int = 0
    reachability: str = "unknown"


REACHABILITIES = ("public", "private", "unknown")
"""The values of `Announcement.reachability` (swarm/reach_rules.py decides which)."""

_Addr = constr(strict=True, min_length=1, max_length=MAX_ADDR_CHARS)


class AnnouncementSchema(pydantic.BaseModel):
    """Strict pydantic schema of an encoded Announcement (no type coercion, bounded sizes)."""

    peer_id: constr(strict=True, regex=r"^[1-9A-HJ-NP-Za-km-z]{32,128}$")
    addrs: conlist(_Addr, max_items=MAX_ADDRS)
    model_id: constr(strict=True, regex=r"^[0-9a-f]{8,128}$")
    start: conint(strict=True, ge=0, lt=MAX_LAYER)
    end: conint(strict=True, gt=0, le=MAX_LAYER)
    decode_steps_per_s: confloat(strict=True, ge=0.0, le=MAX_RATE)
    prefill_tokens_per_s: confloat(strict=True, ge=0.0, le=MAX_RATE)
    free_cache_tokens: conint(strict=True, ge=0, le=2**40)
    max_sessions: conint(strict=True, ge=0, le=1_000_000)
    sessions_free: conint(strict=True, ge=0, le=1_000_000)
    version: constr(strict=True, max_length=64)
    protocol: conint(strict=True, ge=0, le=2**31 - 1)
    public_name: Optional[constr(strict=True, max_length=MAX_PUBLIC_NAME_CHARS)] = None
    expires_at: confloat(strict=True, ge=0.0, le=1e12)
    started_at: confloat(strict=True, ge=0.0, le=1e12) = 0.0
    direct_addrs: conlist(_Addr, max_items=MAX_ADDRS) = []
    relay_addrs: conlist(_Addr, max_items=MAX_ADDRS) = []
    client_sessions: conint(strict=True, ge=0, le=1_000_000) = 0
    client_kv_tokens: conint(strict=True, ge=0, le=2**40) = 0
    client_streams: conint(strict=True, ge=0, le=1_000_000) = 0
    client_bytes: conint(strict=True, ge=0, le=2**50) = 0
    max_streams: conint(strict=True, ge=0, le=1_000_000) = 0
    max_buffered_bytes: conint(strict=True, ge=0, le=2**50) = 0
    reachability: constr(strict=True, max_length=16) = "unknown"  # a value unknown here reads as "unknown"

    class Config:
        extra = pydantic.Extra.ignore

    @pydantic.root_validator(skip_on_failure=True)
    def _span_and_slots(cls, values: dict[str, Any]) -> dict[str, Any]:
        if values["start"] >= values["end"]:
            raise ValueError(f"empty span [{values['start']}, {values['end']})")
        if values["sessions_free"] > values["max_sessions"]:
            raise ValueError("sessions_free > max_sessions")
        return values


def encode_announcement(ann: Announcement) -> dict[str, Any]:
    """Announcement -> msgpack-able dict (numbers normalised to the schema's strict types).

    Raises:
        ProtocolError: the announcement itself violates the schema (a local bug or bad config).
    """
    record = dataclasses.asdict(ann)
    record["addrs"] = list(ann.addrs)
    record["direct_addrs"] = list(ann.direct_addrs)
    record["relay_addrs"] = list(ann.relay_addrs)
    for name in ("decode_steps_per_s", "prefill_tokens_per_s", "expires_at", "started_at"):
        record[name] = float(record[name])
    if decode_announcement(record) is None:
        raise ProtocolError(f"announcement violates the record schema: {ann}")
    return record


def decode_announcement(record: Any) -> Optional[Announcement]:
    """Decoded msgpack value -> Announcement, or None when malformed (wrong types, out of bounds).

    Unknown fields are ignored, so newer peers can add fields without breaking older readers.
    """
    if not isinstance(record, dict):
        return None
    try:
        parsed = AnnouncementSchema.parse_obj(record)
    except (pydantic.ValidationError, TypeError):
        return None
    fields = parsed.dict()
    fields["addrs"] = tuple(fields["addrs"])
    fields["direct_addrs"] = tuple(fields["direct_addrs"])
    fields["relay_addrs"] = tuple(fields["relay_addrs"])
    if fields["reachability"] not in REACHABILITIES:
        fields["reachability"] = "unknown"
    return Announcement(**fields)
