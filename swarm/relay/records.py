"""Relay offers in the DHT, relay addresses, and the messages of a relay connection's hello; pure.

A reachable peer that relays stores a `RelayOffer` as a signed blob (`RELAY_BLOB_NAME`) under
`RELAYS_KEY`, so the blob's owner is the relay's authenticated peer id. A relayed peer announces
relay addresses: the relay's TCP endpoint followed by `/p2p/<relay peer id>`
(`/ip4/10.77.0.10/tcp/41000/p2p/Qm…`).

The hello messages of a relay connection are msgpack maps with an "op" and bounded fields,
decoded by `decode_message` (anything else is a ProtocolError):
    register (peer → relay): {"op": "register", "peer": peer id}
    challenge (relay → peer): {"op": "challenge", "nonce": 32 bytes}
    proof (peer → relay): {"op": "proof", "key": RSA public key (OpenSSH bytes), "sig": bytes}
    registered (relay → peer): {"op": "registered"}
    dial (relay → peer, on the control connection): {"op": "dial", "token": 16 bytes}
    ping / pong (control connection keepalive): {"op": "ping"} / {"op": "pong"}
    connect (client → relay): {"op": "connect", "peer": peer id}
    accept (peer → relay, first message of a data connection): {"op": "accept", "token": 16 bytes}
    connected (relay → client): {"op": "connected"}
    refused (relay → either): {"op": "refused", "why": text}

This module does no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgpack
import pydantic.v1 as pydantic
from pydantic.v1 import conint, conlist, constr

from swarm.errors import ProtocolError
from swarm.limits import MAX_ADDR_CHARS
from swarm.netaddr import maddr_host_port

RELAYS_KEY = "swarm/relays"
"""DHT key under which relays store their offers (one blob per relay)."""
RELAY_BLOB_NAME = "relay"
MAX_RELAY_ENDPOINTS = 8
MAX_MESSAGE_BYTES = 2048
"""Largest hello message either side of a relay connection accepts."""
TOKEN_BYTES = 16
NONCE_BYTES = 32
_PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,128}")
_MAX_WHY_CHARS = 300


@dataclasses.dataclass(frozen=True)
class RelayOffer:
    """A reachable peer's offer to relay streams for peers that cannot be dialled.

    Attributes:
        peer_id: the relay's peer id (the signer of the DHT blob).
        endpoints: TCP multiaddrs of its relay listener, at most MAX_RELAY_ENDPOINTS.
        max_peers: peers it registers at most; free_peers: how many more it takes now.
        max_conns_per_peer: relayed connections open at once per registered peer.
        bytes_per_s: relayed bytes per second per registered peer, both directions together.
    """

    peer_id: str
    endpoints: tuple[str, ...]
    max_peers: int
    free_peers: int
    max_conns_per_peer: int
    bytes_per_s: int

    def addrs(self) -> tuple[str, ...]:
        """The relay addresses of this offer (`relay_addr` of each endpoint)."""
        return tuple(relay_addr(e, self.peer_id) for e in self.endpoints)


class _OfferSchema(pydantic.BaseModel):
    endpoints: conlist(constr(strict=True, min_length=1, max_length=MAX_ADDR_CHARS),
                       min_items=1, max_items=MAX_RELAY_ENDPOINTS)
    max_peers: conint(strict=True, ge=0, le=1_000_000)
    free_peers: conint(strict=True, ge=0, le=1_000_000)
    max_conns_per_peer: conint(strict=True, ge=1, le=1_000_000)
    bytes_per_s: conint(strict=True, ge=1, le=1 << 40)

    class Config:
        extra = pydantic.Extra.ignore


def encode_offer(offer: RelayOffer) -> bytes:
    """The blob value of an offer (its peer id is the blob's signer, not part of the value)."""
    fields = dataclasses.asdict(offer)
    del fields["peer_id"]
    fields["endpoints"] = list(offer.endpoints)
    return msgpack.packb(fields, use_bin_type=True)


def decode_offer(peer_id: str, value: bytes) -> RelayOffer | None:
    """The offer in a blob signed by `peer_id`, or None when malformed or out of bounds (unknown
    fields are ignored, so newer relays can add some)."""
    try:
        record = msgpack.unpackb(value, raw=False, strict_map_key=True)
        parsed = _OfferSchema.parse_obj(record)
    except Exception:  # msgpack and pydantic raise many types on junk
        return None
    if parsed.free_peers > parsed.max_peers:
        return None
    return RelayOffer(peer_id=peer_id, endpoints=tuple(parsed.endpoints), max_peers=parsed.max_peers,
                      free_peers=parsed.free_peers, max_conns_per_peer=parsed.max_conns_per_peer,
                      bytes_per_s=parsed.bytes_per_s)


def relay_addr(endpoint: str, relay_peer_id: str) -> str:
    """A relay address: the relay's TCP endpoint multiaddr and its peer id."""
    return f"{endpoint}/p2p/{relay_peer_id}"


def parse_relay_addr(addr: str) -> tuple[str, int, str] | None:
    """(host, port, relay peer id) of `/ip4|ip6/HOST/tcp/PORT/p2p/ID`; None when it is not one."""
    if not isinstance(addr, str) or len(addr) > MAX_ADDR_CHARS:
        return None
    endpoint, sep, peer = addr.rpartition("/p2p/")
    host_port = maddr_host_port(endpoint) if sep else None
    if host_port is None or endpoint.count("/") != 4 or not _PEER_ID.fullmatch(peer):
        return None
    return host_port[0], host_port[1], peer


_FIELDS: dict[str, dict[str, tuple[type, int]]] = {
    # op → field → (type, exact length for bytes / longest for str; 0: any up to the message bound)
    "register": {"peer": (str, 128)},
    "challenge": {"nonce": (bytes, NONCE_BYTES)},
    "proof": {"key": (bytes, 0), "sig": (bytes, 0)},
    "registered": {},
    "dial": {"token": (bytes, TOKEN_BYTES)},
    "ping": {},
    "pong": {},
    "connect": {"peer": (str, 128)},
    "accept": {"token": (bytes, TOKEN_BYTES)},
    "connected": {},
    "refused": {"why": (str, _MAX_WHY_CHARS)},
}


def encode_message(op: str, **fields: Any) -> bytes:
    """A hello message; `refused` reasons are cut to their bound."""
    if op == "refused":
        fields["why"] = str(fields["why"])[:_MAX_WHY_CHARS]
    message = {"op": op, **fields}
    decode_message(msgpack.packb(message, use_bin_type=True))  # a local bug must not reach the wire
    return msgpack.packb(message, use_bin_type=True)


def decode_message(data: bytes, *expected: str) -> dict[str, Any]:
    """A checked hello message.

    Args:
        data: the frame, at most MAX_MESSAGE_BYTES.
        expected: the ops acceptable here (none: any).
    Raises:
        ProtocolError: not msgpack, not a known op (or not one of `expected`), missing, extra or
            mistyped fields, or a peer id or bytes of the wrong shape.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"relay message of {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises many types on junk
        raise ProtocolError("relay message is not msgpack") from None
    op = message.get("op") if isinstance(message, dict) else None
    spec = _FIELDS.get(op) if isinstance(op, str) else None
    if spec is None or (expected and op not in expected):
        want = "/".join(expected) or "a relay message"
        raise ProtocolError(f"expected {want}, got {str(op)[:40]!r}")
    if set(message) != {"op", *spec}:
        raise ProtocolError(f"relay {op} has fields {sorted(map(str, message))}")
    for name, (kind, size) in spec.items():
        value = message[name]
        if not isinstance(value, kind):
            raise ProtocolError(f"relay {op}.{name} must be {kind.__name__}")
        if kind is bytes and size and len(value) != size:
            raise ProtocolError(f"relay {op}.{name} must have {size} bytes")
        if kind is str and len(value) > size:
            raise ProtocolError(f"relay {op}.{name} is over {size} characters")
    if "peer" in spec and not _PEER_ID.fullmatch(message["peer"]):
        raise ProtocolError("relay message names a malformed peer id")
    return message
