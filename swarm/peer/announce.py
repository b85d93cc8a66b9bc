"""Keeping this peer's span announced in the DHT: periodic refresh, withdrawal on shutdown.

The record carries live numbers (free KV-cache tokens, free session slots) read from the span's
session table at each refresh, so clients route around a full peer within one period.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import swarm
from swarm.dht.node import SwarmDHT
from swarm.dht.records import MAX_ADDRS, Announcement
from swarm.errors import SwarmError
from swarm.wire import PROTOCOL_GENERATION

logger = logging.getLogger(__name__)

EXPIRY_PERIODS = 2.5
"""A record lives this many refresh periods, so one lost refresh does not drop the peer."""


@dataclass(frozen=True)
class Throughput:
    """Measured speed of a whole span: one-token decode steps/s and prefill tokens/s."""

    decode_steps_per_s: float
    prefill_tokens_per_s: float


class Announcer:
    """Publishes the span of `rt` (a `SpanRuntime`) every `period_s` seconds.

    Args:
        dht: the peer's DHT node.
        rt: the served span (model_id, start, end, sessions).
        throughput: measured at start.
        period_s: refresh period, seconds.
        public_name: optional display name.
        direct_addrs: TCP multiaddrs of the peer's direct-stream listener (swarm.direct), if any.
    """

    def __init__(self, dht: SwarmDHT, rt, throughput: Throughput, period_s: float, public_name: str | None,
                 direct_addrs: tuple[str, ...] = ()):
        self._dht, self._rt, self._tp = dht, rt, throughput
        self._period_s = period_s
        self._public_name = public_name
        self._direct_addrs = direct_addrs[:MAX_ADDRS]
        self._started_at = time.time()

    def record(self) -> Announcement:
        """The announcement as of now (expires_at is set by the DHT wrapper)."""
        s = self._rt.sessions
        return Announcement(
            peer_id=self._dht.peer_id,
            addrs=tuple(self._dht.visible_maddrs()[:MAX_ADDRS]),  # a host with many interfaces has more
            model_id=self._rt.model_id,
            start=self._rt.start,
            end=self._rt.end,
            decode_steps_per_s=self._tp.decode_steps_per_s,
            prefill_tokens_per_s=self._tp.prefill_tokens_per_s,
            free_cache_tokens=s.free_cache_tokens,
            max_sessions=s.max_sessions,
            sessions_free=0 if self._rt.drain.active else s.sessions_free,
            version=swarm.__version__,
            protocol=PROTOCOL_GENERATION,
            public_name=self._public_name,
            expires_at=0.0,
            started_at=self._started_at,
            direct_addrs=self._direct_addrs,
        )

    @property
    def throughput(self) -> Throughput:
        """The speed announced now."""
        return self._tp

    @throughput.setter
    def throughput(self, tp: Throughput) -> None:
        self._tp = tp

    async def announce_once(self) -> None:
        """Publish now. Raises DHTError or ProtocolError when no node stores it."""
        await self._dht.announce(self.record(), expiration_s=self._period_s * EXPIRY_PERIODS)

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
        await self._dht.withdraw(self._rt.model_id)
