"""swarm.route.replay: a failed hop's recorded steps are replayed without regrouping any step."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.route.replay import claim_frames, clip_steps, drop_rows, replay_frames, split_steps


def blocks(*sizes: int) -> list[np.ndarray]:
    """Steps of the given row counts; row r holds the value r (its offset), so rows can be traced."""
    out, a = [], 0
    for n in sizes:
        out.append(np.arange(a, a + n, dtype=np.float32)[:, None].repeat(2, axis=1))
        a += n
    return out


def sizes(bs) -> list[int]:
    return [b.shape[0] for b in bs]


def test_clip_keeps_step_boundaries_and_cuts_only_the_edge_steps():
    bs = blocks(64, 64, 1, 1, 1)
    got = clip_steps(bs, 32, 130)
    assert sizes(got) == [32, 64, 1, 1]
    assert np.concatenate(got)[:, 0].tolist() == list(range(32, 130))


def test_clip_drops_a_step_recorded_past_the_end():
    # the hop's input to the step in flight is recorded before the route's position moves on
    assert sizes(clip_steps(blocks(5, 1, 1), 0, 6)) == [5, 1]
    assert clip_steps(blocks(5), 5) == []


def test_drop_rows_cuts_the_tail_of_the_recorded_steps_in_place():
    bs = blocks(5, 1, 1, 3)
    drop_rows(bs, 4)  # the last step's 3 rows and one more
    assert sizes(bs) == [5, 1]
    bs = blocks(5, 1, 3)
    drop_rows(bs, 2)  # a verify pass of 3 rows kept 1
    assert sizes(bs) == [5, 1, 1]
    assert np.concatenate(bs)[:, 0].tolist() == list(range(7))


def test_frames_group_whole_steps_up_to_the_row_and_step_caps():
    frames = list(replay_frames(blocks(38, *[1] * 70), max_rows=64, max_steps=1024))
    assert [s for _, s in frames] == [(38,) + (1,) * 26, (1,) * 44]
    assert np.concatenate([x for x, _ in frames])[:, 0].tolist() == list(range(108))
    frames = list(replay_frames(blocks(*[1] * 10), max_rows=64, max_steps=4))
    assert [s for _, s in frames] == [(1,) * 4, (1,) * 4, (1, 1)]


def test_a_lone_step_goes_without_a_step_list_and_a_long_one_is_cut_to_the_row_cap():
    frames = list(replay_frames(blocks(300, 1), max_rows=256, max_steps=1024))
    assert [(x.shape[0], s) for x, s in frames] == [(256, ()), (45, (44, 1))]


@pytest.mark.parametrize("steps", [(), (3,), (1, 2), (2, 1, 1)])
def test_split_undoes_the_grouping(steps):
    x = np.arange(sum(steps) or 4, dtype=np.float32)[:, None]
    parts = split_steps(x, steps)
    assert sizes(parts) == (list(steps) if steps else [x.shape[0]])
    assert np.array_equal(np.concatenate(parts), x)


def test_claim_frames_put_short_steps_in_verify_passes_and_leave_a_prompt_chunk_alone():
    # a last hop's record: a 40-row prompt chunk, a 3-row prompt tail, five decode steps, a 2-row
    # verify group; verify passes hold at most 4 rows, frames at most 16 rows
    record = blocks(40, 3, 1, 1, 1, 1, 1, 2)
    frames = list(claim_frames(record, 16, 8, 4))
    assert [(x.shape[0], steps, verify) for x, steps, verify in frames] == [
        (16, (), False), (16, (), False), (8, (), False),  # the 40-row chunk, cut as replay cuts it
        (4, (3, 1), True), (4, (1, 1, 1, 1), True), (2, (), True),
    ]
    # every row once, in order, and no step's rows regrouped
    assert np.array_equal(np.concatenate([x for x, _, _ in frames]), np.concatenate(record))
    assert [(s, v) for _, s, v in claim_frames(blocks(2, 1), 16, 8, 4)] == [((2, 1), True)]


def test_claim_frames_recompute_short_steps_in_the_checkers_exact_group():
    # one-row decode steps and a 2-row verify group, replayed by a checker exact up to 3 rows: steps
    # of 3 rows, never across the 5-row prompt tail (a prefill step keeps its own rows)
    record = blocks(5, 1, 1, 1, 2, 1, 1)
    frames = list(claim_frames(record, 16, 8, 8, group_rows=3))
    assert [(x.shape[0], steps, verify) for x, steps, verify in frames] == [(8, (5, 3), True), (4, (3, 1), True)]
    assert np.array_equal(np.concatenate([x for x, _, _ in frames]), np.concatenate(record))
