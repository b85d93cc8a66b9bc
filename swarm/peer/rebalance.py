"""A serving peer's periodic re-evaluation of its span: drain, then move, when placement says so.

Every period, after a random extra delay of up to half a period (so that peers that joined
together do not re-evaluate together, and so that two evaluations are at least one period
apart), the peer reads the swarm's announcements and asks `swarm.route.placement.rebalance`
whether another span would raise the swarm's routable throughput by at least `min_gain` or take
this peer off a dead end. If so it drains: it refuses new sessions (BUSY, and announces no free
slot), waits for its open sessions to end, asks again with a fresh read (the swarm may have
changed while it drained), and only then moves. A drain that does not finish within one period is
abandoned until the next evaluation: a peer never drops a running session to move.

The DHT read, the move and the clock are passed in, so this loop runs against a real peer in
`swarm.peer.server` and against fakes in its unit test.

This module does not: load spans, fetch bytes or announce (the injected `move` does).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from swarm.errors import SwarmError
from swarm.kv.budget import SpanBudget
from swarm.route.placement import MIN_GAIN, Placement, rebalance
from swarm.route.plan import PeerSpan

logger = logging.getLogger(__name__)


class Drain:
    """Whether a span is draining, and an event for "its last session ended".

    The stream handler refuses new sessions while `active`, and calls `session_ended(n_left)` after
    every release.
    """

    def __init__(self) -> None:
        self.active: str | None = None
        self._empty = asyncio.Event()

    def start(self, why: str) -> None:
        """Refuse new sessions from now on, with `why` as the message."""
        self.active = why
        self._empty.clear()

    def stop(self) -> None:
        """Admit sessions again."""
        self.active = None

    def session_ended(self, sessions_left: int) -> None:
        """Called by the handler after a release; wakes the drainer when none is left."""
        if sessions_left == 0:
            self._empty.set()

    async def wait_empty(self, sessions: Callable[[], int], timeout_s: float) -> bool:
        """Wait until `sessions()` is 0, at most `timeout_s` seconds; True when it is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while sessions() > 0:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._empty.clear()
            try:
                await asyncio.wait_for(self._empty.wait(), left)
            except asyncio.TimeoutError:
                return sessions() == 0
        return True


@dataclass
class Rebalancer:
    """Re-evaluates a serving peer's span every `period_s` seconds and moves it when worthwhile.

    Attributes:
        peer_id: this peer's id (its own record is replaced by `me()` when evaluating).
        budget: what fits this peer's memory.
        period_s: seconds between evaluations (plus a random delay of up to half a period).
        announcements: async () -> announced `PeerSpan`s of the model (a fresh DHT read).
        me: () -> this peer's current `PeerSpan` (span and measured speed).
        sessions: () -> sessions open now.
        move: async (start, end) -> None: load and announce the new span; raises SwarmError.
        drain: the span's drain state, shared with the stream handler.
        min_gain: relative gain in routable throughput a move needs.
        allowed: None, or (start, end) -> whether the model can be cut to that span
            (`swarm.route.placement.choose_span`).
        rng: random source of the delays.
        moves: completed moves, (start, end), in order.
    """

    peer_id: str
    budget: SpanBudget
    period_s: float
    announcements: Callable[[], Awaitable[Sequence[PeerSpan]]]
    me: Callable[[], PeerSpan]
    sessions: Callable[[], int]
    move: Callable[[int, int], Awaitable[None]]
    drain: Drain
    min_gain: float = MIN_GAIN
    allowed: Callable[[int, int], bool] | None = None
    rng: random.Random = field(default_factory=random.Random)
    moves: list[tuple[int, int]] = field(default_factory=list)

    async def run(self) -> None:
        """Evaluate forever (until cancelled); a failed evaluation or move is logged and retried."""
        while True:
            await asyncio.sleep(self.period_s * (1.0 + 0.5 * self.rng.random()))
            try:
                await self.evaluate_once()
            except SwarmError as e:
                logger.warning("rebalancing skipped: %s", e)
            except Exception:  # noqa: BLE001 - a bug here must show, not end the loop silently
                logger.exception("rebalancing failed")

    async def evaluate_once(self) -> Placement | None:
        """One evaluation: the move made, or None when staying (or when the drain timed out)."""
        decision = await self._decide()
        if decision is None:
            return None
        logger.info(
            "moving to layers %d:%d (%s: routable %.1f -> %.1f tokens/s); draining",
            decision.start,
            decision.end,
            decision.reason,
            decision.routable_before,
            decision.routable_after,
        )
        self.drain.start(f"peer is moving to layers {decision.start}:{decision.end}")
        try:
            if not await self.drain.wait_empty(self.sessions, self.period_s):
                logger.info("sessions did not end within %.0f s; staying for now", self.period_s)
                return None
            decision = await self._decide()  # the swarm may have changed while draining
            if decision is None:
                return None
            await self.move(decision.start, decision.end)
            self.moves.append((decision.start, decision.end))
            return decision
        finally:
            self.drain.stop()

    async def _decide(self) -> Placement | None:
        others = [p for p in await self.announcements() if p.peer_id != self.peer_id]
        decision = rebalance([*others, self.me()], self.me(), self.budget, self.min_gain, self.allowed)
        return None if decision.reason == "stays" else decision
