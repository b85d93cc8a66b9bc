"""The open/retry ladder, failure reasons and restore arithmetic of a route session
(swarm/route/ladder.py, swarm/route/failover.py, swarm/route/restore.py): one test per branch."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.errors import Busy, PeerTimeout, PeerUnreachable, ProtocolError, ShuttingDown, SwarmError
from swarm.route.failover import Exclusions, FailoverPolicy, FailureReason, failure_reason
from swarm.route.ladder import NoRouteAction, after_no_route, plan_fresh
from swarm.route.restore import CannotRestore, rebuild_rows, restore_point

POLICY = FailoverPolicy(max_open_attempts=3)


def test_opening_reads_the_dht_every_attempt_and_a_failover_reuses_its_snapshot_once():
    assert [plan_fresh(a, opening=True) for a in range(3)] == [True, True, True]
    assert [plan_fresh(a, opening=False) for a in range(3)] == [False, True, True]


@pytest.mark.parametrize("opening", [True, False])
def test_no_route_is_retried_until_the_last_attempt_then_raised(opening):
    actions = [after_no_route(a, POLICY, opening=opening, too_long=False) for a in range(3)]
    assert actions == [NoRouteAction.RETRY, NoRouteAction.RETRY, NoRouteAction.RAISE]


def test_a_session_too_long_at_opening_is_raised_at_once():
    assert after_no_route(0, POLICY, opening=True, too_long=True) is NoRouteAction.RAISE


def test_a_session_too_long_mid_generation_is_retried_then_raised_as_gone():
    actions = [after_no_route(a, POLICY, opening=False, too_long=True) for a in range(3)]
    assert actions == [NoRouteAction.RETRY, NoRouteAction.RETRY, NoRouteAction.RAISE_GONE]


@pytest.mark.parametrize(
    "error, reason",
    [
        (PeerTimeout("t"), "timeout"),
        (PeerUnreachable("u"), "unreachable"),
        (ShuttingDown("s"), "shutting_down"),
        (Busy("b"), "busy"),
        (ProtocolError("p"), "malformed"),
        (SwarmError("e"), "error"),
    ],
)
def test_each_error_kind_has_its_reason_code(error, reason):
    got = failure_reason(error)
    assert got is FailureReason(reason) and got == reason and got.value == reason
    assert got.liveness == (reason in ("timeout", "unreachable"))


def test_only_liveness_failures_are_suspects_a_probe_may_clear():
    ex = Exclusions(60.0)
    ex.add("t", FailureReason.TIMEOUT, 0.0, 1.0)
    ex.add("u", FailureReason.UNREACHABLE, 0.0, 1.0)
    ex.add("b", FailureReason.BUSY, 0.0, 1.0)
    ex.add("m", FailureReason.MALFORMED, 0.0, 1.0)
    assert ex.liveness_suspects(1.0) == {"t", "u"}
    assert ex.liveness_suspects(61.0) == set()  # expired


def test_without_offers_nothing_is_restored_and_a_replacement_past_base_cannot_restore():
    assert restore_point([{64}], base=0, pos=100, prompt_tokens=None) == 0
    with pytest.raises(CannotRestore):
        restore_point([{64}], base=64, pos=100, prompt_tokens=None)


def test_at_the_first_open_any_offered_length_all_hops_share_counts_below_the_whole_prompt():
    assert restore_point([{64, 128, 192}, {64, 128}], base=0, pos=0, prompt_tokens=200) == 128
    assert restore_point([{64, 128, 192}], base=0, pos=0, prompt_tokens=192) == 128  # not the whole prompt
    assert restore_point([{64}, set()], base=0, pos=0, prompt_tokens=200) == 0


def test_mid_generation_only_lengths_in_base_to_pos_count():
    assert restore_point([{64, 128, 192}], base=0, pos=150, prompt_tokens=300) == 128
    assert restore_point([{64, 128}], base=64, pos=150, prompt_tokens=300) == 128
    with pytest.raises(CannotRestore):
        restore_point([{64}], base=128, pos=150, prompt_tokens=300)


def test_a_rebuild_replays_the_restored_prefix_in_chunks_then_the_recorded_steps():
    prefix = np.arange(10, dtype=np.float32).reshape(5, 2)
    recorded = [np.ones((3, 2), np.float32), np.full((1, 2), 2.0, np.float32)]
    rows = rebuild_rows(prefix, recorded, n_recorded=4, chunk_tokens=2)
    assert [r.shape[0] for r in rows] == [2, 2, 1, 3, 1]
    assert np.array_equal(np.concatenate(rows[:3]), prefix)
    assert [r.shape[0] for r in rebuild_rows(None, recorded, n_recorded=3, chunk_tokens=2)] == [3]
    assert rebuild_rows(None, [], n_recorded=0, chunk_tokens=2) is None
