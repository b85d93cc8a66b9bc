"""Announcements (as read from the DHT) → the planner's immutable `PeerSpan` snapshot (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from swarm.route.plan import PeerSpan


def peer_spans(announcements: Iterable, rtt_ms: Mapping[str, float] | None = None) -> list[PeerSpan]:
    """One `PeerSpan` per announcement, with the measured RTT (ms) where `rtt_ms` has one.

    Args:
        announcements: objects with the fields of `swarm.dht.records.Announcement`.
        rtt_ms: peer id → measured round trip in ms.
    """
    rtt_ms = rtt_ms or {}
    return [
        PeerSpan(
            peer_id=a.peer_id,
            start=a.start,
            end=a.end,
            decode_steps_per_s=a.decode_steps_per_s,
            prefill_tokens_per_s=a.prefill_tokens_per_s,
            free_cache_tokens=a.free_cache_tokens,
            sessions_free=a.sessions_free,
            rtt_ms=rtt_ms.get(a.peer_id),
            incarnation=a.started_at,
            reachability=a.reachability,
        )
        for a in announcements
    ]
