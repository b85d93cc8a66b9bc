"""Swarm time: this node's clock error against the other nodes', measured by ping; pure.

Every DHT node compares a record's expiration with its own clock (hivemind's get_dht_time, the wall
clock), and refuses or drops records that look expired or too far ahead. A peer whose clock is 120 s
behind would write records that every other node finds already expired; one 600 s ahead, records that
outlive it by ten minutes (or are refused). So a peer measures its offset against other nodes (each
ping answer carries the remote's wall time: swarm.p2p) and writes expirations in *swarm time*: its own
clock plus the median offset. The median ignores a minority of wrong clocks, its own included.

One exchange gives Cristian's estimate: offset = remote_time - (sent + received) / 2, wrong by at most
half the round trip; of several exchanges the one with the shortest round trip is kept (as NTP's clock
filter does, RFC 5905 section 10).

This module does no I/O and reads no clock: callers pass times in.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable, Optional

SKEW_WARN_S = 10.0
"""A clock further than this from the swarm's median is reported (peer log, `swarm status`); a few
seconds are normal between machines without NTP and cost nothing (records live minutes)."""

CLOCK_PEERS = 8
"""A peer measures its offset against at most this many other nodes."""


@dataclasses.dataclass(frozen=True)
class ClockProbe:
    """One ping exchange with another node.

    Attributes:
        offset_s: remote wall time minus this node's, seconds (positive: the remote is ahead).
        rtt_s: round trip of the exchange, seconds; the estimate is wrong by at most half of it.
    """

    offset_s: float
    rtt_s: float


def probe(sent_s: float, received_s: float, remote_s: float) -> ClockProbe:
    """Cristian's estimate from one exchange: local send and receive times and the remote's answer
    (all wall-clock seconds); the remote is assumed to have read its clock halfway through."""
    return ClockProbe(remote_s - (sent_s + received_s) / 2, received_s - sent_s)


def best(probes: Iterable[ClockProbe]) -> Optional[ClockProbe]:
    """The exchange with the shortest round trip (least error bound), or None if there is none."""
    return min(probes, key=lambda p: p.rtt_s, default=None)


def swarm_offset(offsets_s: Iterable[float]) -> Optional[float]:
    """Swarm time minus this node's clock, seconds: the median of the other nodes' offsets (what matters
    is agreeing with the nodes that store and read this node's records, so its own clock gets no vote),
    None without any. With a single other node, half its offset: two clocks cannot tell which one is
    wrong, and meeting halfway keeps each one's records acceptable to the other."""
    found = list(offsets_s)
    if not found:
        return None
    return found[0] / 2 if len(found) == 1 else statistics.median(found)


def skew_words(offset_s: float) -> str:
    """`offset_s` (this clock minus the reference's) in words: "120 s behind", "600 s ahead", or
    "in step (+0.3 s)" within SKEW_WARN_S."""
    if abs(offset_s) <= SKEW_WARN_S:
        return f"in step ({offset_s:+.1f} s)"
    return f"{abs(offset_s):.0f} s {'ahead' if offset_s > 0 else 'behind'}"


def skew_against(offset_s: float, reference: str) -> str:
    """`offset_s` (this clock minus the reference's) as a phrase: "120 s behind the swarm's median",
    "600 s ahead of the swarm's median", "in step (+0.3 s) with the swarm's median"."""
    words = skew_words(offset_s)
    if abs(offset_s) <= SKEW_WARN_S:
        return f"{words} with {reference}"
    return f"{words} {reference}" if offset_s < 0 else f"{words} of {reference}"


def relative_skews(offsets_s: dict[str, float]) -> dict[str, float]:
    """Each node's clock minus the median clock of them and the observer, seconds, from offsets the
    observer measured (remote minus observer): a wrong observer clock cancels out once a majority
    agrees, and with two nodes the observer's clock breaks the tie. Empty for no offsets."""
    if not offsets_s:
        return {}
    median = statistics.median([*offsets_s.values(), 0.0])
    return {node: off - median for node, off in offsets_s.items()}
