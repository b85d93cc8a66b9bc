"""Failover policy of a route session: how long to wait for a hop, when to retry, whom to avoid.

Pure arithmetic and bookkeeping over numbers the caller passes in (a hop's announced speed, the
time now, a random draw), so the client's route session and the simulator apply the same policy,
and every branch is unit-tested without peers.

- `step_timeout_s`: a hop that has not answered within what its announced throughput predicts
  (times a slack, plus a floor of a few seconds) is treated as dead, so a frozen peer is found in
  seconds, not after a fixed two minutes.
- `backoff_s`: the first retry is immediate; later ones wait exponentially longer, with jitter so
  that the clients of a peer that just died do not stampede its replacement together.
- `Exclusions`: peers that just failed are avoided for `exclusion_s` (about a minute), or until
  they come back as a new incarnation (a restarted peer announces a new `started_at`); a peer a
  spot check caught computing wrong (`WRONG_OUTPUT`) for as long as the check policy says, restart
  or not.
- `FailureReason`, `failure_reason`: why a hop failed, one code per kind of `SwarmError`, for
  exclusions and telemetry.

This module does not: sleep, read a clock, open streams or read the DHT.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from swarm.errors import Busy, PeerTimeout, PeerUnreachable, ProtocolError, ShuttingDown, SwarmError
from swarm.route.plan import PeerSpan


@dataclass(frozen=True)
class FailoverPolicy:
    """Limits of one generation's failover.

    Attributes:
        max_failovers: hop replacements allowed in one generation before it fails.
        max_open_attempts: plans tried to open (or re-open) one stretch of layers.
        backoff_base_s, backoff_cap_s: second attempt waits about base, then doubling up to cap
            (seconds, before jitter).
        exclusion_s: how long a failed peer is avoided, seconds.
        step_timeout_floor_s: no step waits less than this for a hop, seconds.
        step_timeout_slack: expected compute time is multiplied by this before the floor is added.
        open_timeout_s: dialling a peer and its Open handshake, seconds.
        probe_timeout_s: one RTT probe (ping) of a peer, seconds.
        replay_chunk_tokens: rows per Forward when replaying a failed hop's inputs.
    """

    max_failovers: int = 8
    max_open_attempts: int = 6
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 2.0
    exclusion_s: float = 60.0
    step_timeout_floor_s: float = 3.0
    step_timeout_slack: float = 8.0
    open_timeout_s: float = 5.0
    probe_timeout_s: float = 1.0
    replay_chunk_tokens: int = 256


def backoff_s(attempt: int, policy: FailoverPolicy, rng: random.Random) -> float:
    """Seconds to wait before attempt number `attempt` (0-based) of opening a stretch of layers.

    Attempt 0 waits nothing; attempt k >= 1 waits min(cap, base * 2**(k-1)) times a uniform draw
    in [0.5, 1) ("equal jitter", as in AWS's backoff-and-jitter note).
    """
    if attempt <= 0:
        return 0.0
    ceiling = min(policy.backoff_cap_s, policy.backoff_base_s * 2.0 ** (attempt - 1))
    return ceiling * (0.5 + 0.5 * rng.random())


def step_timeout_s(span: PeerSpan, n_tokens: int, policy: FailoverPolicy, steps: Sequence[int] = ()) -> float:
    """Seconds to wait for a hop's answer to a Forward of `n_tokens` rows (of the row counts `steps`,
    when it carries several steps: wire.Forward.steps).

    floor + slack * (expected compute + round trip), where expected compute is, per step, 1 / decode
    steps/s for one row and rows / prefill tokens/s for more, as the peer announced them. A peer
    whose announced speed is unusable (zero, infinite) gets the floor alone.
    """

    def compute_s(rows: int) -> float:
        rate = span.decode_steps_per_s if rows <= 1 else span.prefill_tokens_per_s / max(1, rows)
        return 1.0 / rate if 0 < rate < math.inf else 0.0

    rtt_s = span.rtt_ms / 1000.0 if span.rtt_ms is not None and 0 <= span.rtt_ms < math.inf else 0.0
    compute = sum(compute_s(k) for k in steps or (n_tokens,))
    return policy.step_timeout_floor_s + policy.step_timeout_slack * (compute + rtt_s)


class FailureReason(StrEnum):
    """Why a hop failed; the value is the code telemetry and the simulator's reports show."""

    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    SHUTTING_DOWN = "shutting_down"
    BUSY = "busy"
    MALFORMED = "malformed"
    ERROR = "error"
    WRONG_OUTPUT = "wrong_output"
    """A spot check found the peer's hidden states outside the band (swarm/route/verify.py)."""

    @property
    def liveness(self) -> bool:
        """The peer seemed gone (no answer, no stream): a fresh probe that it answers clears this;
        a peer that answered garbage or said it is busy is not cleared by a probe."""
        return self in (FailureReason.TIMEOUT, FailureReason.UNREACHABLE)


def failure_reason(error: SwarmError) -> FailureReason:
    """The reason code of a hop failure (the most specific `SwarmError` subclass first)."""
    if isinstance(error, PeerTimeout):
        return FailureReason.TIMEOUT
    if isinstance(error, PeerUnreachable):
        return FailureReason.UNREACHABLE
    if isinstance(error, ShuttingDown):
        return FailureReason.SHUTTING_DOWN
    if isinstance(error, Busy):
        return FailureReason.BUSY
    if isinstance(error, ProtocolError):
        return FailureReason.MALFORMED
    return FailureReason.ERROR


@dataclass(frozen=True)
class Exclusion:
    """Why and until when one peer is avoided.

    Attributes:
        reason: the failure.
        until_s: the exclusion ends at this time (caller's clock, seconds).
        incarnation: the `started_at` of the announcement that failed; another value is a restart.
    """

    reason: FailureReason
    until_s: float
    incarnation: float


class Exclusions:
    """Peers to leave out of plans for a while; shared by the sessions of one client.

    A peer is excluded from `add` until `exclusion_s` later, or until the swarm shows another
    incarnation of it, or until `forgive` (it answered a fresh probe).
    """

    def __init__(self, exclusion_s: float):
        self.exclusion_s = exclusion_s
        self._by_peer: dict[str, Exclusion] = {}

    def add(self, peer_id: str, reason: FailureReason, now_s: float, incarnation: float,
            for_s: float | None = None) -> None:
        """Avoid `peer_id` from `now_s` for `for_s` seconds (None: `exclusion_s`); a later failure
        replaces it, except that an exclusion for `WRONG_OUTPUT` is only ever extended. A peer
        excluded for `WRONG_OUTPUT` stays excluded when it restarts."""
        until = now_s + (self.exclusion_s if for_s is None else for_s)
        old = self._by_peer.get(peer_id)
        if old is not None and old.reason is FailureReason.WRONG_OUTPUT and old.until_s >= until:
            return
        self._by_peer[peer_id] = Exclusion(FailureReason(reason), until, incarnation)

    def forgive(self, peer_ids: Iterable[str]) -> None:
        """Stop avoiding these peers (they answered a probe)."""
        for peer_id in peer_ids:
            self._by_peer.pop(peer_id, None)

    def active(self, now_s: float, incarnations: Mapping[str, float] | None = None) -> frozenset[str]:
        """Peers excluded at `now_s`; expired ones and restarted ones are dropped for good.

        Args:
            now_s: time now, on the clock `add` was given.
            incarnations: peer id -> `started_at` of its current announcement, where known.
        """
        incarnations = incarnations or {}
        for peer_id, ex in list(self._by_peer.items()):
            restarted = peer_id in incarnations and incarnations[peer_id] != ex.incarnation
            if now_s >= ex.until_s or (restarted and ex.reason is not FailureReason.WRONG_OUTPUT):
                del self._by_peer[peer_id]
        return frozenset(self._by_peer)

    def reason(self, peer_id: str) -> FailureReason | None:
        """Why `peer_id` is excluded, or None."""
        ex = self._by_peer.get(peer_id)
        return ex.reason if ex else None

    def liveness_suspects(self, now_s: float) -> set[str]:
        """Peers excluded at `now_s` for not answering (`FailureReason.liveness`): the ones a fresh
        probe may clear."""
        return {p for p in self.active(now_s) if self._by_peer[p].reason.liveness}
