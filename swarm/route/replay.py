"""Replaying a failed hop's recorded steps: which rows, in which frames.

A client keeps, per hop, the rows of every step it sent there (or the hop was pushed), one block per
step: `[rows, hidden]` float32, in position order. A replacement hop must compute the same steps
exactly as the failed one did, because llama.cpp's CPU matmuls round a step of many rows differently
from steps of a few (ggml-cpu picks gemv or a tiled gemm by row count; measured on one span replaying
70 decode steps: SmolLM2 bit-equal in groups of up to 16 rows, 0.30 logits off at 64; Qwen2.5 0.5B
bit-equal up to 3 rows, 0.36 off at 4). A regrouped replay gives the replacement other KV, and the
generation drifts from a fault-free run's.

So a replay never regroups steps: consecutive recorded steps share one frame (`Forward.steps` lists
their row counts, and the peer computes each as its own step), which costs one round trip per frame
rather than one per step.

Pure functions; `swarm/client/session.py` sends the frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def clip_steps(blocks: Sequence[np.ndarray], lo: int, hi: int | None = None) -> list[np.ndarray]:
    """The recorded steps' rows at offsets [lo, hi) of their concatenation, still one block per step.

    A step cut by `lo` or `hi` keeps only its rows inside. (A replay starts at a restored prefix
    length, a multiple of the 64-token block grid; the peer computes a multi-row step in chunks on
    that grid from the step's start, so a prefill step cut there computes as it did first.)

    Args:
        blocks: `[rows_i, hidden]` arrays, one per step, in position order.
        lo, hi: row offsets; hi None means to the end.
    Returns:
        The blocks (views) inside [lo, hi), none empty.
    """
    out, a = [], 0
    for b in blocks:
        n = b.shape[0]
        s, e = max(lo - a, 0), n if hi is None else min(hi - a, n)
        if s < e:
            out.append(b[s:e])
        a += n
    return out


def replay_frames(
    blocks: Sequence[np.ndarray], max_rows: int, max_steps: int
) -> Iterator[tuple[np.ndarray, tuple[int, ...]]]:
    """Group recorded steps into frames without regrouping any step's rows.

    Args:
        blocks: `[rows_i, hidden]` arrays, one per step, in position order.
        max_rows: most rows per frame (the client's replay chunk, at most the peers' frame cap).
        max_steps: most steps per frame (wire.MAX_FORWARD_STEPS).
    Yields:
        (rows `[n, hidden]`, steps): steps are the row counts of the frame's steps for
        `Forward.steps`, or () when the frame holds one step. A step longer than `max_rows` (a
        prefill chunk larger than the replay chunk) is cut into frames of `max_rows` rows.
    """
    group: list[np.ndarray] = []
    rows = 0
    for b in blocks:
        for i in range(0, b.shape[0], max_rows):
            piece = b[i : i + max_rows]
            if group and (rows + piece.shape[0] > max_rows or len(group) == max_steps):
                yield _frame(group)
                group, rows = [], 0
            group.append(piece)
            rows += piece.shape[0]
    if group:
        yield _frame(group)


def claim_frames(
    blocks: Sequence[np.ndarray], max_rows: int, max_steps: int, verify_rows: int, group_rows: int = 1
) -> Iterator[tuple[np.ndarray, tuple[int, ...], bool]]:
    """Group a last hop's recorded steps for an exact replay that answers a token after every row
    it can: runs of steps of at most `verify_rows` rows go in verify frames (`Forward.verify`, at
    most `verify_rows` rows), a longer step (a prompt chunk) in frames of its own, as
    `replay_frames` cuts it.

    Consecutive steps of at most `group_rows` rows (decode steps, verify groups) are recomputed
    in steps of `group_rows` rows: the checker's proven exact group (`OpenOk.verify_rows`), whose
    steps give what one-row steps give bit for bit, as the recorded ones did. No other step's rows
    are regrouped.

    Yields:
        (rows, steps, verify): as `replay_frames`, and whether the frame is a verify pass.
    """
    run: list[np.ndarray] = []
    for b in blocks:
        if b.shape[0] <= verify_rows:
            run.append(b)
            continue
        yield from ((x, s, True) for x, s in replay_frames(_regrouped(run, group_rows), verify_rows, max_steps))
        run = []
        yield from ((x, s, False) for x, s in replay_frames([b], max_rows, max_steps))
    yield from ((x, s, True) for x, s in replay_frames(_regrouped(run, group_rows), verify_rows, max_steps))


def _regrouped(blocks: list[np.ndarray], group_rows: int) -> list[np.ndarray]:
    """Runs of blocks of at most `group_rows` rows re-cut into blocks of `group_rows` rows."""
    out: list[np.ndarray] = []
    small: list[np.ndarray] = []
    for b in [*blocks, None]:
        if b is not None and b.shape[0] <= group_rows:
            small.append(b)
            continue
        if small:
            rows = np.concatenate(small)
            out.extend(rows[i : i + group_rows] for i in range(0, rows.shape[0], group_rows))
            small = []
        if b is not None:
            out.append(b)
    return out


def _frame(group: list[np.ndarray]) -> tuple[np.ndarray, tuple[int, ...]]:
    if len(group) == 1:
        return group[0], ()
    return np.concatenate(group), tuple(b.shape[0] for b in group)


def drop_rows(blocks: list[np.ndarray], n: int) -> None:
    """Drop the last `n` rows of the recorded steps, in place: whole blocks from the end, then the
    tail of the block cut (a verify pass's rejected rows; swarm/spec/verify.py)."""
    while n > 0 and blocks:
        rows = blocks[-1].shape[0]
        if rows > n:
            blocks[-1] = blocks[-1][: rows - n]
            return
        blocks.pop()
        n -= rows


def split_steps(rows: np.ndarray, steps: tuple[int, ...]) -> list[np.ndarray]:
    """The per-step blocks of a frame's rows (the inverse of `replay_frames`'s grouping)."""
    if not steps:
        return [rows]
    return np.split(rows, np.cumsum(steps)[:-1])
