"""The model's announcement records as the DHT shows them, in virtual time (one view for all readers).

A peer publishes its `PeerSpan` record when it starts serving and again every announce period
(with its current free slots and KV tokens). The DHT's behaviour that matters to routing and
placement is kept:

- a published record becomes visible `announce_delay_s` later (the store's round trips);
- a record lives `EXPIRY_PERIODS` announce periods after it was published, so a live peer's
  record never lapses, and a crashed peer's last record lingers up to 2.5 periods (75 s at the
  server's 30 s period) — clients and joining peers see it and must cope;
- a graceful leaver (or a peer that moves its span) withdraws: its record disappears at once (the
  real peer stores a tombstone over it), and a store still in flight from before is dropped.

This module does not: model DHT routing, lookups that miss records, or per-reader views (every
reader sees the same records; reading costs the caller's own `dht_read_s`).
"""

from __future__ import annotations

import asyncio

from swarm.route.plan import PeerSpan

EXPIRY_PERIODS = 2.5
"""Record lifetime in announce periods (as `swarm.peer.announce.EXPIRY_PERIODS`, which imports the DHT)."""


class RecordBoard:
    """Announced spans of one model: `records` maps peer id → its visible `PeerSpan`.

    Args:
        loop: the (virtual-time) loop that schedules arrivals and expiries.
        announce_delay_s: seconds from publishing to being visible.
        announce_period_s: seconds between a live peer's refreshes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, announce_delay_s: float, announce_period_s: float):
        self._loop = loop
        self.announce_delay_s = announce_delay_s
        self.expiry_s = EXPIRY_PERIODS * announce_period_s
        self.records: dict[str, PeerSpan] = {}
        self._epoch: dict[str, int] = {}
        self._expires_at: dict[str, float] = {}

    def snapshot(self) -> list[PeerSpan]:
        """The visible records now, in publication order (a fresh list)."""
        return list(self.records.values())

    def publish(self, record: PeerSpan) -> None:
        """Store `record`; it is visible after the announce delay, until a later one replaces it."""
        pid = record.peer_id
        epoch = self._epoch.setdefault(pid, 0)
        self._expires_at[pid] = self._loop.time() + self.expiry_s
        self._loop.call_later(self.announce_delay_s, self._land, record, epoch)

    def withdraw(self, peer_id: str) -> None:
        """Remove the peer's record now (a tombstone); stores still in flight are dropped."""
        self._epoch[peer_id] = self._epoch.get(peer_id, 0) + 1
        self.records.pop(peer_id, None)

    def abandon(self, peer_id: str) -> None:
        """The peer stopped refreshing (it crashed): its last record expires on its own."""
        expires_at = self._expires_at.get(peer_id)
        if expires_at is not None:
            self._loop.call_at(expires_at, self._expire, peer_id, self._epoch.get(peer_id, 0))

    def _land(self, record: PeerSpan, epoch: int) -> None:
        if self._epoch.get(record.peer_id) == epoch:
            self.records[record.peer_id] = record

    def _expire(self, peer_id: str, epoch: int) -> None:
        if self._epoch.get(peer_id) == epoch:
            self.withdraw(peer_id)
