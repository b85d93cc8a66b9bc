"""The `PeerDirectory` of the swarm client: the model's announcements from the DHT, RTTs by ping.

A route session (swarm/client/session.py) asks it for the announced spans to plan over and to probe
peers it excluded for not answering; the simulator's `sim.clients.ClientSite` plays the same part.

This module does not: plan routes, exclude peers or open span streams.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Collection

from swarm.dht.node import SwarmDHT, get_dht_time
from swarm.dht.records import Announcement
from swarm.errors import SwarmError
from swarm.relay import dial as relay_dial
from swarm.relay.handshake import RelayIdentity
from swarm.route.plan import PeerSpan
from swarm.route.snapshot import peer_spans

DHT_READ_TIMEOUT_S = 30.0
"""Reading the model's announcements from the DHT gives up after this long."""
SNAPSHOT_MAX_AGE_S = 60.0
"""A failover may re-plan from a DHT read up to this old before reading anew."""
RTT_MAX_AGE_S = 300.0
"""A peer's RTT older than this is measured again (as Petals' ping aggregator expires its entries)."""


class DHTDirectory:
    """`PeerDirectory` over the DHT: the model's announcements, with RTTs measured by ping.

    An RTT is the fastest of a few pings (`SwarmP2P.ping`). A successful one is kept and, once older
    than `rtt_max_age_s`, measured again in the background while plans go on using it: a first
    probe can catch a peer busy (a new peer measures its own speed as it starts) and paths change,
    and a client that kept its first RTT for good would route around such a peer for its whole
    life. A failed first probe is not kept, so the session excludes the peer for a while and it is
    probed again afterwards; a failed re-measurement keeps the RTT it had (a dead peer fails its
    dial). A peer reached through a relay (it announces relay addresses) is pinged through its
    relay, so its RTT is the relayed path's and the planner prices the hop by it.

    Args:
        n_layers: the model's layer count; announcements of spans past it are dropped (None: unchecked).

    Attributes:
        rtt_ms: peer id -> measured round trip, ms.
        rtt_max_age_s: an RTT older than this (s) is measured again when `peers` next runs.
    """

    def __init__(self, dht: SwarmDHT, model_id: str, probe_timeout_s: float, n_layers: int | None = None):
        self._dht, self._model_id, self._probe_timeout_s = dht, model_id, probe_timeout_s
        self._n_layers = n_layers
        self.rtt_ms: dict[str, float] = {}
        self.rtt_max_age_s = RTT_MAX_AGE_S
        self._measured_at: dict[str, float] = {}  # peer id -> time.monotonic() of its RTT
        self._remeasuring: dict[str, asyncio.Future] = {}  # peer id -> its re-measurement running
        self._addrs: dict[str, tuple[str, ...]] = {}
        self._direct: dict[str, tuple[str, ...]] = {}
        self._relay: dict[str, tuple[str, ...]] = {}
        self._identity: RelayIdentity | None = None
        self._announced: list[Announcement] = []
        self._read_at = -math.inf

    def addrs(self, peer_id: str) -> tuple[str, ...]:
        """The multiaddrs `peer_id` announced last (empty if never seen)."""
        return self._addrs.get(peer_id, ())

    def direct_addrs(self, peer_id: str) -> tuple[str, ...]:
        """The direct-stream endpoints `peer_id` announced last (empty: none, or never seen)."""
        return self._direct.get(peer_id, ())

    def relay_addrs(self, peer_id: str) -> tuple[str, ...]:
        """The relay addresses `peer_id` announced last (empty: reachable itself, or never seen)."""
        return self._relay.get(peer_id, ())

    @property
    def identity(self) -> RelayIdentity:
        """This client's credentials for relayed streams (made on first use: one RSA signature)."""
        if self._identity is None:
            self._identity = RelayIdentity(self._dht.identity.private_key)
        return self._identity

    async def peers(self, skip_probe: frozenset[str], fresh: bool) -> list[PeerSpan]:
        """Announced spans of the model; unmeasured peers outside `skip_probe` are pinged first.

        Args:
            skip_probe: peers not to ping now (excluded ones).
            fresh: read the DHT now; else reuse the last read if it is under SNAPSHOT_MAX_AGE_S old
                (a failover re-plan: a DHT read can wait seconds on a frozen DHT node).
        Raises:
            SwarmError: the DHT did not answer within DHT_READ_TIMEOUT_S.
        """
        if fresh or time.monotonic() - self._read_at > SNAPSHOT_MAX_AGE_S:
            try:
                async with asyncio.timeout(DHT_READ_TIMEOUT_S):
                    read = await self._dht.get_announcements(self._model_id, self._n_layers)
            except TimeoutError:
                raise SwarmError(f"the DHT did not answer within {DHT_READ_TIMEOUT_S:.0f} s") from None
            # A read can miss live records (a frozen DHT node delays stores and answers): a record
            # seen before stays until its own expiry; a dead peer in it fails to dial and is excluded.
            now, ids = get_dht_time(), {a.peer_id for a in read}
            self._announced = read + [
                a for a in self._announced if a.peer_id not in ids and a.expires_at > now
            ]
            self._read_at = time.monotonic()
        announced = self._announced
        self._addrs.update((a.peer_id, a.addrs) for a in announced)
        self._direct.update((a.peer_id, a.direct_addrs) for a in announced)
        self._relay.update((a.peer_id, a.relay_addrs) for a in announced)
        unmeasured = [
            a.peer_id for a in announced if a.peer_id not in self.rtt_ms and a.peer_id not in skip_probe
        ]
        self._remeasure_old([a.peer_id for a in announced if a.peer_id not in skip_probe])
        answered = await self.probe(unmeasured)
        failed = {p: math.inf for p in unmeasured if p not in answered}
        return peer_spans(announced, {**self.rtt_ms, **failed})

    async def _ping(self, peer_id: str) -> None:
        """Measure `peer_id`'s RTT into `rtt_ms`.

        Raises:
            SwarmError: it did not answer (`rtt_ms` unchanged).
        """
        timeout_s, relays = self._probe_timeout_s, self.relay_addrs(peer_id)
        if relays:
            rtt = await relay_dial.ping(self.identity, relays, peer_id, timeout_s=timeout_s)
        else:
            rtt = await self._dht.transport.ping(peer_id, self.addrs(peer_id), timeout_s=timeout_s)
        self.rtt_ms[peer_id], self._measured_at[peer_id] = rtt, time.monotonic()

    def _remeasure_old(self, peer_ids: Collection[str]) -> None:
        """Start measuring again, in the background, the RTTs among `peer_ids` older than
        `rtt_max_age_s` (one re-measurement of a peer at a time)."""
        now = time.monotonic()
        for peer_id in peer_ids:
            if (peer_id in self.rtt_ms and peer_id not in self._remeasuring
                    and now - self._measured_at.get(peer_id, now) > self.rtt_max_age_s):
                task = asyncio.ensure_future(self._remeasure(peer_id))
                self._remeasuring[peer_id] = task
                task.add_done_callback(lambda _, p=peer_id: self._remeasuring.pop(p, None))

    async def _remeasure(self, peer_id: str) -> None:
        try:
            async with asyncio.timeout(self._probe_timeout_s * 3):  # dialling has no timeout of its own
                await self._ping(peer_id)
        except (SwarmError, TimeoutError):
            pass  # keep the RTT it had: a dead peer fails its dial, and the session excludes it

    async def probe(self, peer_ids: Collection[str]) -> set[str]:
        """Ping these peers in parallel; keep the RTTs of the ones that answered and return them."""

        async def ping(peer_id: str) -> str | None:
            try:
                await self._ping(peer_id)
                return peer_id
            except SwarmError:
                self.rtt_ms.pop(peer_id, None)
                return None

        for peer_id in peer_ids:  # an RTT counts only if measured by this probe
            self.rtt_ms.pop(peer_id, None)
        try:
            async with asyncio.timeout(self._probe_timeout_s * 3):  # dialling has no timeout of its own
                return {p for p in await asyncio.gather(*(ping(p) for p in peer_ids)) if p}
        except TimeoutError:
            return {p for p in peer_ids if p in self.rtt_ms}
