"""Failover policy arithmetic: backoff, step timeouts, exclusions (swarm/route/failover.py)."""

from __future__ import annotations

import random

import pytest

from swarm.route.failover import Exclusions, FailoverPolicy, FailureReason, backoff_s, step_timeout_s
from swarm.route.plan import PeerSpan
from tests.helpers.factories import peer_span

POLICY = FailoverPolicy(
    backoff_base_s=0.1, backoff_cap_s=2.0, step_timeout_floor_s=3.0, step_timeout_slack=8.0
)


def span(decode: float = 100.0, prefill: float = 1000.0, rtt_ms: float | None = 10.0) -> PeerSpan:
    return peer_span("p", 0, 10, decode=decode, prefill=prefill, cache=4096, slots=1, rtt_ms=rtt_ms)


def test_first_attempt_is_immediate_then_backoff_doubles_with_jitter_up_to_the_cap():
    rng = random.Random(1)
    assert backoff_s(0, POLICY, rng) == 0.0
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (30, 2.0)]:
        waits = [backoff_s(attempt, POLICY, rng) for _ in range(200)]
        assert all(0.5 * ceiling <= w < ceiling for w in waits)
        assert len(set(waits)) > 100  # jittered, not one fixed value


def test_decode_step_timeout_follows_the_announced_speed_and_rtt():
    # 3 s floor + 8 * (1/100 s + 10 ms)
    assert step_timeout_s(span(), 1, POLICY) == pytest.approx(3.0 + 8 * 0.02)
    assert step_timeout_s(span(decode=1.0), 1, POLICY) == pytest.approx(3.0 + 8 * 1.01)


def test_prefill_timeout_grows_with_the_tokens_in_the_frame():
    # 500 tokens at 1000 tokens/s = 0.5 s of compute
    assert step_timeout_s(span(), 500, POLICY) == pytest.approx(3.0 + 8 * 0.51)


@pytest.mark.parametrize("rtt_ms", [None, float("inf")])
def test_unknown_rtt_adds_nothing_and_bad_speeds_give_the_floor(rtt_ms):
    assert step_timeout_s(span(rtt_ms=rtt_ms), 1, POLICY) == pytest.approx(3.0 + 8 * 0.01)
    assert step_timeout_s(span(decode=0.0, rtt_ms=rtt_ms), 1, POLICY) == pytest.approx(3.0)
    assert step_timeout_s(span(prefill=float("inf"), rtt_ms=rtt_ms), 64, POLICY) == pytest.approx(3.0)


def test_exclusion_lasts_exclusion_s_then_expires():
    ex = Exclusions(60.0)
    ex.add("p", "timeout", now_s=100.0, incarnation=1.0)
    assert ex.active(159.9) == {"p"} and ex.reason("p") == "timeout"
    assert ex.active(160.0) == frozenset() and ex.reason("p") is None


def test_a_later_failure_extends_the_exclusion():
    ex = Exclusions(60.0)
    ex.add("p", "timeout", 0.0, 1.0)
    ex.add("p", "busy", 50.0, 1.0)
    assert ex.active(100.0) == {"p"} and ex.reason("p") == "busy"


def test_a_new_incarnation_ends_the_exclusion_and_the_same_one_does_not():
    ex = Exclusions(60.0)
    ex.add("p", "unreachable", 0.0, incarnation=1.0)
    ex.add("q", "unreachable", 0.0, incarnation=1.0)
    assert ex.active(1.0, {"p": 1.0, "q": 1.0}) == {"p", "q"}
    assert ex.active(1.0, {"p": 2.0}) == {"q"}  # p restarted; q not seen: still excluded


def test_forgive_ends_exclusions():
    ex = Exclusions(60.0)
    ex.add("p", "timeout", 0.0, 1.0)
    ex.add("q", "timeout", 0.0, 1.0)
    ex.forgive(["p", "unknown"])
    assert ex.active(1.0) == {"q"}


def test_a_peer_caught_computing_wrong_stays_excluded_across_restarts_and_other_failures():
    ex = Exclusions(60.0)
    ex.add("liar", FailureReason.WRONG_OUTPUT, 0.0, incarnation=1.0, for_s=3600.0)
    ex.add("liar", FailureReason.UNREACHABLE, 10.0, incarnation=1.0)  # a shorter exclusion does not replace it
    assert ex.active(1000.0, {"liar": 2.0}) == {"liar"}  # restarted: still excluded
    assert ex.reason("liar") is FailureReason.WRONG_OUTPUT
    assert ex.liveness_suspects(1000.0) == set()  # a probe does not forgive it
    assert ex.active(3600.0) == frozenset()
