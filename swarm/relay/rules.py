"""Pure relay decisions: a peer's relay roles, the relay's budget, byte-rate buckets, relay choice.

No I/O, clocks or randomness: callers pass the time and the measurements.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from swarm.relay.records import RelayOffer

REACHABILITY = ("public", "private")
"""`swarm serve --reachability`: public (others can dial it) or private (behind a NAT: use a relay)."""
RELAY_MODES = ("auto", "off")
"""`swarm serve --relay`: auto (a private peer registers with a relay) or off (never relayed)."""


@dataclass(frozen=True)
class RelayRoles:
    """What a peer does about relaying.

    Attributes:
        serve: offer the relay service to others (a reachable peer).
        use: register with a relay and announce only relay addresses (a private peer).
    """

    serve: bool
    use: bool


def relay_roles(reachability: str, relay: str, relay_service: bool) -> RelayRoles:
    """A peer's relay roles from its options: a public peer relays for others unless
    `relay_service` is off; a private one is relayed unless `relay` is "off" (and never relays:
    nobody could dial its relay service).

    Raises:
        ValueError: an unknown reachability or relay mode.
    """
    if reachability not in REACHABILITY or relay not in RELAY_MODES:
        raise ValueError(f"reachability {reachability!r} / relay {relay!r}")
    private = reachability == "private"
    return RelayRoles(serve=relay_service and not private, use=private and relay == "auto")


@dataclass(frozen=True)
class RelayLimits:
    """A relay's budget, announced in its offer.

    Attributes:
        max_peers: peers registered at once.
        max_conns_per_peer: relayed connections open at once to one registered peer.
        bytes_per_s: relayed bytes per second per registered peer (both directions, all its
            connections together); a decode step of a 4,096-wide model moves 16 KiB per hop.
        burst_bytes: bytes a quiet peer may send at once before the rate applies (a prefill chunk).
    """

    max_peers: int = 64
    max_conns_per_peer: int = 32
    bytes_per_s: int = 16 << 20
    burst_bytes: int = 8 << 20


class RelayBudget:
    """Registrations and open relayed connections of one relay, within its `RelayLimits`."""

    def __init__(self, limits: RelayLimits):
        self.limits = limits
        self._conns: dict[str, int] = {}  # registered peer → relayed connections open

    @property
    def free_peers(self) -> int:
        """How many more peers it registers now."""
        return max(0, self.limits.max_peers - len(self._conns))

    def register(self, peer_id: str) -> str | None:
        """Register `peer_id` (again: a re-registration keeps its count). Returns why not, or None."""
        if peer_id not in self._conns and not self.free_peers:
            return f"BUSY: this relay serves {self.limits.max_peers} peers already"
        self._conns.setdefault(peer_id, 0)
        return None

    def unregister(self, peer_id: str) -> None:
        """Forget `peer_id` (its open connections end with it)."""
        self._conns.pop(peer_id, None)

    def open(self, peer_id: str) -> str | None:
        """Count a new relayed connection to `peer_id`. Returns why not, or None."""
        if peer_id not in self._conns:
            return f"peer {peer_id[:12]}… is not registered at this relay"
        if self._conns[peer_id] >= self.limits.max_conns_per_peer:
            return (f"BUSY: peer {peer_id[:12]}… has {self.limits.max_conns_per_peer} relayed connections "
                    "open, this relay's limit per peer")
        self._conns[peer_id] += 1
        return None

    def close(self, peer_id: str) -> None:
        """A relayed connection to `peer_id` ended."""
        if self._conns.get(peer_id, 0) > 0:
            self._conns[peer_id] -= 1


@dataclass
class TokenBucket:
    """A byte-rate limit: `rate` bytes per second on average, `burst` at once.

    `take(n, now_s)` spends n bytes and says how long to wait before sending them; the wait is what
    makes the average come out at `rate` (the standard token bucket, e.g. RFC 2697's single rate).
    """

    rate: float
    burst: float
    _level: float = field(init=False)
    _at: float = field(init=False, default=-math.inf)

    def __post_init__(self):
        self._level = self.burst

    def take(self, n_bytes: int, now_s: float) -> float:
        """Spend `n_bytes` at `now_s` (seconds, any monotonic clock); returns seconds to wait (>= 0)."""
        if self._at != -math.inf:
            self._level = min(self.burst, self._level + (now_s - self._at) * self.rate)
        self._at = now_s
        self._level -= n_bytes
        return 0.0 if self._level >= 0 else -self._level / self.rate


def choose_relay(offers: Collection[RelayOffer], rtt_ms: Mapping[str, float], own_peer_id: str,
                 avoid: Collection[str] = ()) -> RelayOffer | None:
    """The relay a private peer registers with: the lowest measured RTT among offers with a free
    place, other than itself and the relays to `avoid` (recently lost or refused); ties go to the
    smaller peer id. None when no offer qualifies.

    Args:
        offers: relay offers read from the DHT.
        rtt_ms: relay peer id → measured round trip to its endpoint, ms (missing or inf: unreachable).
        own_peer_id: this peer.
        avoid: relay peer ids not to choose now.
    """
    usable = [o for o in offers if o.free_peers > 0 and o.peer_id != own_peer_id and o.peer_id not in avoid
              and math.isfinite(rtt_ms.get(o.peer_id, math.inf))]
    return min(usable, key=lambda o: (rtt_ms[o.peer_id], o.peer_id), default=None)
