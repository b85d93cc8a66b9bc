"""Keeping this peer's span announced in the DHT: periodic refresh, withdrawal on shutdown.

The record carries live numbers (free KV-cache tokens, free session slots) read from the span
(`swarm.peer.span.Span.record`, the one place a peer's record is made) at each refresh, so clients
route around a full peer within one period. Before each announcement the peer measures its clock
against other nodes (swarm.dht.clockwatch), so its expirations are in the swarm's time.
"""

from __future__ import annotations

import asyncio
import logging
import time

import swarm
from swarm.dht.clockwatch import clock_targets, measure_clock
from swarm.dht.node import SwarmDHT
from swarm.dht.records import MAX_ADDRS, Announcement
from swarm.errors import SwarmError
from swarm.limits import EXPIRY_PERIODS
from swarm.peer.quotas import ClientLimits
from swarm.netaddr import listen_port
from swarm.peer.span import Span
from swarm.reach import ReachabilityMonitor
from swarm.reach_rules import UNKNOWN, announced_addrs, announced_direct_addrs
from swarm.wire import PROTOCOL_GENERATION

logger = logging.getLogger(__name__)



class Announcer:
    """Publishes `span` every `period_s` seconds.

    Args:
        dht: the peer's DHT node.
        span: the served span; its record (`Span.record`) is read at each refresh.
        period_s: refresh period, seconds.
        public_name: optional display name.
        direct_addrs: TCP multiaddrs of the peer's direct-stream listener (swarm.direct), if any.
        relayed: the peer cannot be dialled (reachability private, relay on): it announces no libp2p
            or direct address, only `relay_addrs`.
        initial_peers: multiaddrs the peer joined through; clock probes fall back on them.
        limits: the peer's limits per client; sessions and KV tokens are read from the span's table.
        reach: the peer's reachability (swarm.reach), read at each refresh: announced as is, and a
            public address it confirmed is announced first (libp2p and direct); None: "unknown".
        direct_port: the direct listener's port (what a confirmed public direct endpoint names).
    Attributes:
        relay_addrs: the relay addresses announced (swarm.relay.registrar sets them).
    """

    def __init__(self, dht: SwarmDHT, span: Span, period_s: float, public_name: str | None,
                 direct_addrs: tuple[str, ...] = (), relayed: bool = False,
                 initial_peers: tuple[str, ...] = (), limits: ClientLimits = ClientLimits(),
                 reach: ReachabilityMonitor | None = None, direct_port: int | None = None):
        self._dht, self._span = dht, span
        self._initial_peers = initial_peers
        self._period_s = period_s
        self._public_name = public_name
        self._direct_addrs = () if relayed else direct_addrs
        self._relayed = relayed
        self.relay_addrs: tuple[str, ...] = ()
        self._reach, self._direct_port = reach, direct_port
        self._started_at = time.time()
        self._limits = limits

    def record(self) -> Announcement:
        """The announcement as of now (expires_at is set by the DHT wrapper)."""
        r = self._span.record(self._dht.peer_id, started_at=self._started_at)
        addrs, direct = tuple(self._dht.visible_maddrs()), self._direct_addrs
        reach = None if self._reach is None else self._reach.current
        port = listen_port(addrs)
        if reach is not None and port is not None:
            addrs = announced_addrs(addrs, reach, port, r.peer_id)
        if reach is not None and self._direct_port is not None:
            direct = announced_direct_addrs(direct, reach, self._direct_port)
        return Announcement(
            peer_id=r.peer_id,
            addrs=() if self._relayed else addrs[:MAX_ADDRS],  # a host with many interfaces has more
            model_id=self._span.model_id,
            start=r.start,
            end=r.end,
            decode_steps_per_s=r.decode_steps_per_s,
            prefill_tokens_per_s=r.prefill_tokens_per_s,
            free_cache_tokens=r.free_cache_tokens,
            max_sessions=self._span.sessions.max_sessions,
            sessions_free=r.sessions_free,
            version=swarm.__version__,
            protocol=PROTOCOL_GENERATION,
            public_name=self._public_name,
            expires_at=0.0,
            started_at=r.incarnation,
            direct_addrs=direct[:MAX_ADDRS],
            reachability=UNKNOWN if reach is None else reach.status,
            relay_addrs=self.relay_addrs[:MAX_ADDRS],
            client_sessions=self._span.sessions.owner_sessions,
            client_kv_tokens=self._span.sessions.owner_tokens,
            client_streams=self._limits.streams,
            client_bytes=self._limits.bytes,
            max_streams=self._limits.max_streams,
            max_buffered_bytes=self._limits.max_buffered_bytes,
        )

    async def announce_once(self) -> None:
        """Measure the clock against other nodes, then publish. Raises DHTError or ProtocolError when no
        node stores the record."""
        try:
            announced = await self._dht.get_announcements(self._span.model_id)
        except SwarmError:
            announced = []
        await measure_clock(self._dht, clock_targets(self._dht.peer_id, announced, self._initial_peers))
        await self._dht.announce(self.record(), expiration_s=self._period_s * EXPIRY_PERIODS)

    async def set_relay(self, relay_addrs: tuple[str, ...]) -> None:
        """Announce these relay addresses now (a relayed peer changed relays); a failed store is
        logged, the next refresh retries."""
        self.relay_addrs = relay_addrs
        try:
            await self.announce_once()
        except SwarmError as e:
            logger.warning("announcement of the new relay failed: %s", e)

    async def run(self) -> None:
        """Refresh every period until cancelled; a failed refresh is logged and retried next period."""
        while True:
            await asyncio.sleep(self._period_s)
            try:
                await self.announce_once()
            except SwarmError as e:
                logger.warning("announcement refresh failed: %s", e)

    async def withdraw(self) -> None:
        """Replace the record with a tombstone so clients stop routing here at once."""
        await self._dht.withdraw(self._span.model_id)
