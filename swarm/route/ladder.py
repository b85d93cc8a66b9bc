"""The open/retry ladder of a route session: what to do when a plan to open layers fails.

Opening a stretch of layers (the whole model at the start of a generation, or a failed hop's
layers mid-generation) tries up to `FailoverPolicy.max_open_attempts` plans, waiting `backoff_s`
before each. These functions decide, from the attempt number and what went wrong, whether the next
plan reads the DHT anew and whether a `NoRoute` ends the ladder; swarm/client/session.py acts on them.

This module does not: sleep, read a clock, plan, or open streams.
"""

from __future__ import annotations

from enum import Enum

from swarm.route.failover import FailoverPolicy


class NoRouteAction(Enum):
    """What a `NoRoute` from the planner leads to."""

    RETRY = "retry"
    """Plan again: a DHT read right after a peer froze or restarted can miss live records for a moment."""
    RAISE = "raise"
    """End the ladder with the planner's `NoRoute` as it is."""
    RAISE_GONE = "raise_gone"
    """End the ladder: mid-generation, the peers that could hold a session this long are gone
    (the caller words the `NoRoute` so)."""


def plan_fresh(attempt: int, opening: bool) -> bool:
    """Whether attempt number `attempt` (0-based) plans from a new DHT read.

    `opening`: the generation's first open (its snapshot is read anew anyway); a failover re-plans
    its first attempt from the seconds-old snapshot the generation planned from, which already lists
    the failed hop's peers of the same span, and reads the DHT only on later attempts.
    """
    return opening or attempt > 0


def after_no_route(attempt: int, policy: FailoverPolicy, *, opening: bool, too_long: bool) -> NoRouteAction:
    """The ladder's answer to a `NoRoute` from the plan of attempt number `attempt` (0-based).

    Args:
        attempt: the attempt whose plan failed.
        policy: `max_open_attempts` bounds the ladder.
        opening: the generation's first open (see `plan_fresh`).
        too_long: the `NoRoute` is a `SessionTooLong` (peers serve the layers, none takes a session
            this long).
    Returns:
        RAISE when opening and too_long (no peer takes a session this long, however often we ask)
        or on the last attempt; RAISE_GONE on the last attempt of a failover's too_long; else RETRY.
    """
    if too_long and opening:
        return NoRouteAction.RAISE
    if attempt + 1 < policy.max_open_attempts:
        return NoRouteAction.RETRY
    return NoRouteAction.RAISE_GONE if too_long else NoRouteAction.RAISE
