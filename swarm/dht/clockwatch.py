"""Measuring a DHT node's clock against other nodes and setting its swarm time (swarm.dht.clock).

A serving peer calls `measure_clock` before each announcement: it pings up to clock.CLOCK_PEERS other
nodes (the model's announced peers, then the initial peers), sets `SwarmDHT.clock_offset_s` to their
median offset and says so loudly in its log when its clock is off by more than clock.SKEW_WARN_S.

This module decides nothing about records; swarm.dht.node writes them in swarm time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Sequence

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.dht import clock
from swarm.dht.node import SwarmDHT
from swarm.dht.records import Announcement
from swarm.errors import SwarmError

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
"""How long one clock probe may take, seconds; a node that does not answer in time has no vote."""


def clock_targets(
    own_peer_id: str, announced: Iterable[Announcement], initial_peers: Iterable[str]
) -> list[tuple[str, tuple[str, ...]]]:
    """(peer id, multiaddrs) of at most clock.CLOCK_PEERS other nodes to probe: announced peers first,
    then initial peers (multiaddrs ending in /p2p/<id>; malformed ones are skipped); pure."""
    found: dict[str, tuple[str, ...]] = {}
    for ann in announced:
        if ann.peer_id != own_peer_id:
            found.setdefault(ann.peer_id, ann.addrs)
    for maddr in initial_peers:
        try:
            peer_id = PeerID.from_base58(Multiaddr(maddr).value_for_protocol("p2p")).to_base58()
        except Exception:  # noqa: BLE001 - multiaddr and base58 raise assorted types for bad text
            continue
        if peer_id != own_peer_id:
            found.setdefault(peer_id, (maddr,))
    return list(found.items())[: clock.CLOCK_PEERS]


async def measure_clock(dht: SwarmDHT, targets: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Probe `targets` at once and set `dht.clock_offset_s` and `dht.clock_peers` from the answers
    (unchanged when nobody answers with a time). Logs a warning while the clock is off by more than
    clock.SKEW_WARN_S, and once when it is back in step. Never raises but CancelledError."""

    async def one(peer_id: str, addrs: Sequence[str]):
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S * 2):  # dialling has no timeout of its own
                return (await dht.transport.probe(peer_id, addrs, timeout_s=PROBE_TIMEOUT_S))[1]
        except (SwarmError, TimeoutError):
            return None

    probes = [p for p in await asyncio.gather(*(one(*t) for t in targets)) if p is not None]
    offset = clock.swarm_offset(p.offset_s for p in probes)
    if offset is None:
        return
    was_skewed = bool(dht.clock_words())
    dht.clock_offset_s, dht.clock_peers = offset, len(probes)
    if dht.clock_words():
        logger.warning("CLOCK: %s; records are written in the swarm's time until it is set right (NTP)",
                       dht.clock_words())
    elif was_skewed:
        logger.warning("CLOCK: this machine's clock is back in step with the swarm's (%+.1f s)", offset)
