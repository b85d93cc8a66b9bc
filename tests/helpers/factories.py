"""Test data built in one place: a peer's announced span as the planner sees it (`PeerSpan`).

Each test module keeps a short `span(...)` of its own with the defaults its cases read best with;
all of them build through `peer_span`, so a new `PeerSpan` field is added here once.
"""

from __future__ import annotations

from swarm.route.plan import PeerSpan


def peer_span(
    peer_id: str = "p",
    start: int = 0,
    end: int = 10,
    *,
    decode: float = 10.0,
    prefill: float = 100.0,
    cache: int = 1000,
    slots: int = 4,
    rtt_ms: float | None = None,
) -> PeerSpan:
    """A `PeerSpan` serving global layers [start, end).

    Args:
        decode: one-token steps per second through the whole span.
        prefill: prompt tokens per second through the whole span.
        cache: KV tokens a new session can reserve at the peer.
        slots: session slots free.
        rtt_ms: client <-> peer round trip, ms; None when unknown.
    """
    return PeerSpan(peer_id, start, end, decode, prefill, cache, slots, rtt_ms)
