"""Planning of rollbacks by checkpoint (swarm/peer/checkpoints.py): which checkpoint a rollback
starts from, which recorded rows it computes again and in which groups, and when checkpoints end.
The executor side (`replay`) runs on real spans: tests/integration/test_hybrid_peer.py and
test_deepseek4_peers.py."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.peer.checkpoints import Checkpoints, cut_groups


def rows(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32).reshape(n, 1)


def test_cut_groups_keeps_the_groups_up_to_the_cut():
    assert cut_groups((3, 3, 2), 4) == (3, 1)
    assert cut_groups((3, 3, 2), 3) == (3,)
    assert cut_groups((1,), 1) == (1,)
    for bad in (0, 9):
        with pytest.raises(ValueError):
            cut_groups((3, 3, 2), bad)


def test_a_rejected_verify_pass_rolls_back_from_its_checkpoint_with_the_kept_rows_only():
    cp = Checkpoints()
    cp.add(0, 10, b"state@10")
    cp.record(0, 10, rows(5, 10), np.arange(5, dtype=np.int32), (3, 2), verify=True)
    plan = cp.plan(0, 12)
    assert plan.from_pos == 10 and plan.state == b"state@10" and plan.pos == 12
    [step] = plan.steps
    assert step.pos0 == 10 and step.groups == (3, 2)  # replay cuts the groups at the rollback: (2,)
    cp.rolled_back(0, 12)
    [c] = cp.held(0)
    assert c.end == 12 and c.steps[0].rows.ravel().tolist() == [10, 11]
    assert c.steps[0].token_ids.tolist() == [0, 1] and c.steps[0].groups == (2,)
    # the next pass starts where the kept rows end: the older checkpoint stays behind it
    cp.add(0, 12, b"state@12")
    assert [c.pos for c in cp.held(0)] == [10, 12]


def test_a_pass_sent_ahead_rolls_back_with_the_pass_before_it():
    cp = Checkpoints()
    cp.add(0, 10, b"a")
    cp.record(0, 10, rows(3, 10), None, (3,), verify=True)
    cp.add(0, 13, b"b")  # sent ahead, behind the first pass
    cp.record(0, 13, rows(3, 13), None, (3,), verify=True)
    inside_ahead = cp.plan(0, 14)  # the first pass kept whole, the one ahead cut: from its own state
    assert inside_ahead.from_pos == 13 and [s.pos0 for s in inside_ahead.steps] == [13]
    inside_first = cp.plan(0, 11)  # the first pass rejected: both go, from the first state
    assert inside_first.from_pos == 10 and [s.pos0 for s in inside_first.steps] == [10]
    cp.rolled_back(0, 11)
    assert [(c.pos, c.end) for c in cp.held(0)] == [(10, 11)]


def test_one_row_decode_steps_are_recorded_and_a_prompt_chunk_ends_the_checkpoints():
    cp = Checkpoints()
    cp.add(0, 10, b"a")
    cp.record(0, 10, rows(2, 10), None, (), verify=True)
    cp.record(0, 12, rows(1, 12), None, (), verify=False)
    assert cp.plan(0, 13).steps[-1].groups == (1,)
    cp.record(0, 13, rows(64, 13), None, (), verify=False)  # cannot be recomputed as it was
    assert cp.held(0) == [] and cp.plan(0, 12) is None


def test_no_checkpoint_no_rollback_and_limits_hold():
    cp = Checkpoints(max_checkpoints=2, max_rows=8)
    assert cp.plan(0, 3) is None
    cp.record(0, 0, rows(4), None, (), verify=False)  # nothing held: nothing recorded
    assert cp.held(0) == []
    cp.add(0, 4, b"a")
    assert cp.plan(0, 3) is None  # before the checkpoint: refused, as llama.cpp refuses it
    cp.record(0, 4, rows(8, 4), None, (4, 4), verify=True)
    cp.record(0, 12, rows(1, 12), None, (), verify=False)  # past max_rows: the checkpoint goes
    assert cp.held(0) == []
    for pos in (20, 21, 22):
        cp.add(1, pos, b"x")
        cp.record(1, pos, rows(1, pos), None, (), verify=True)
    assert [c.pos for c in cp.held(1)] == [21, 22]  # the oldest beyond max_checkpoints went
    cp.add(1, 30, b"y")  # rows it never saw (23..29): the older checkpoints cannot reach it
    assert [c.pos for c in cp.held(1)] == [30]
    cp.forget(1)
    assert cp.held(1) == []
