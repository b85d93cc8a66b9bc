"""Rollback by checkpoint: the rejected rows of a verify pass, on a span whose cache cannot truncate.

llama.cpp cannot cut a recurrent state (hybrid models: qwen35, qwen35moe) or DeepSeek-V4's
compressed cache back to an earlier position (`ArchRow.rollback_exact` False), but it exports a
sequence's whole state and imports it exactly (tests/parity/test_synthetic_parity.py). So before
each verify pass on such a span the peer exports the session's state, a *checkpoint* at the pass's
first position, and keeps the input rows of the steps computed after it. Rolling the session back
to a position p after a checkpoint at c imports the checkpoint and computes the kept rows [c, p)
again, in the row groups they were first computed in, cut at p. Each group of a verify pass
computes bit for bit as its rows' one-row decode steps (the span's probed `verify_rows`) and a
decode step is one row, so the state after the rollback is the state plain decoding reaches: the
exactness of speculation (docs/speculative.md) holds on these models too.

A session keeps at most `MAX_CHECKPOINTS` checkpoints (two passes may be in flight: a pipelined
pass sent ahead rolls back with the one before it) with at most `MAX_RECORDED_ROWS` rows after the
oldest; a step of several rows that is not a verify pass (a prompt chunk, computed on the ubatch
grid), or a verify pass in groups larger than the span proved exact, ends every checkpoint of the
session, because part of it could not be computed again as it was. A rollback with no checkpoint
at or before its position is refused, as llama.cpp refuses it. A verify pass that fails half-way
(a bad row after good ones) is rolled back to its start the same way (swarm/peer/span.py).

Cost: one export of the session's state per verify pass (its whole KV or recurrent state) and,
on a rejection, one import and the kept rows again. The states are held in the peer's memory,
outside the KV budget: at most MAX_CHECKPOINTS states per session. A spot check's replay of a
last hop (swarm/route/replay.py `claim_frames`) sends its decode steps as verify frames, each of
which exports the growing state: a cost quadratic in the replayed length, not measured on a real
model (llama.cpp's `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` would export only a hybrid model's
recurrent part; not used: the attention part would then need a truncate the hybrid cache refuses).

This module plans (which checkpoint, which rows again) and holds the records; the executor calls
run in `replay`, on the span's executor thread (swarm/peer/span.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from swarm.errors import ExecutorError
from swarm.ggml_bridge.executor import SpanExecutor

MAX_CHECKPOINTS = 2
"""Checkpoints a session keeps: the pass in flight and one pass sent ahead of its answer."""

MAX_RECORDED_ROWS = 256
"""Rows a session's oldest checkpoint may have after it; past that it is dropped (a rollback that
far back would cost more than the route's rebuild, which the client does instead)."""


@dataclass(frozen=True)
class RecordedStep:
    """One step computed after a checkpoint, as it was computed.

    Attributes:
        pos0: its first position.
        rows: `[n, n_embd]` float32 input rows.
        token_ids: `[n]` int32 ids of the rows, or None (the span reads none).
        groups: row counts of the sub-steps it was computed as (summing to n).
    """

    pos0: int
    rows: np.ndarray
    token_ids: np.ndarray | None
    groups: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.pos0 + int(self.rows.shape[0])


@dataclass
class Checkpoint:
    """A session's exported state at position `pos` and the steps computed after it, in order."""

    pos: int
    state: bytes
    steps: list[RecordedStep] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The position after the last recorded row."""
        return self.steps[-1].end if self.steps else self.pos

    @property
    def n_rows(self) -> int:
        return self.end - self.pos


@dataclass(frozen=True)
class Rollback:
    """What rolling a sequence back to `pos` takes: import `state` (the checkpoint at `from_pos`),
    then compute `steps` again (each in its groups, the last one cut at `pos`)."""

    pos: int
    from_pos: int
    state: bytes
    steps: tuple[RecordedStep, ...]


class Checkpoints:
    """The checkpoints of every session of one span, by sequence id. Touched from the event loop
    only; `replay` runs a `Rollback` on the executor thread."""

    def __init__(self, max_checkpoints: int = MAX_CHECKPOINTS, max_rows: int = MAX_RECORDED_ROWS):
        self.max_checkpoints, self.max_rows = max_checkpoints, max_rows
        self._by_seq: dict[int, list[Checkpoint]] = {}

    def held(self, seq_id: int) -> list[Checkpoint]:
        """The sequence's checkpoints, oldest first (a copy of the list)."""
        return list(self._by_seq.get(seq_id, ()))

    def add(self, seq_id: int, pos: int, state: bytes) -> None:
        """Note the sequence's state at `pos` (it holds positions 0..pos-1), taken before a verify
        pass. A checkpoint that does not end at `pos` (rows it never saw) is dropped, and the oldest
        beyond `max_checkpoints`."""
        kept = [c for c in self._by_seq.get(seq_id, ()) if c.end == pos]
        kept.append(Checkpoint(pos, state))
        self._by_seq[seq_id] = kept[-self.max_checkpoints:]

    def record(self, seq_id: int, pos0: int, rows: np.ndarray, token_ids: np.ndarray | None,
               groups: Sequence[int], *, verify: bool) -> None:
        """Note a step computed on the sequence at `pos0` (after `add` for a verify pass).

        Args:
            rows: `[n, n_embd]` float32 inputs (kept by reference: the caller does not change them).
            token_ids: `[n]` their ids, or None.
            groups: the sub-steps it was computed in (`Forward.steps`), () for one.
            verify: a verify pass, whose groups compute as one-row steps; otherwise only a one-row
                step can be computed again as it was, and any other step ends the checkpoints.
        """
        held = self._by_seq.get(seq_id)
        if not held:
            return
        n = int(rows.shape[0])
        if not verify and n != 1:
            self.forget(seq_id)
            return
        step = RecordedStep(pos0, rows, token_ids, tuple(groups) or (n,))
        kept = [c for c in held if c.end == pos0 and c.n_rows + n <= self.max_rows]
        for c in kept:
            c.steps.append(step)
        if kept:
            self._by_seq[seq_id] = kept
        else:
            self.forget(seq_id)

    def plan(self, seq_id: int, pos: int) -> Rollback | None:
        """How to roll the sequence back to `pos`: from the latest checkpoint at or before `pos`
        whose records reach it; None when there is none."""
        for c in reversed(self._by_seq.get(seq_id, ())):
            if c.pos <= pos <= c.end:
                return Rollback(pos, c.pos, c.state, tuple(s for s in c.steps if s.pos0 < pos))
        return None

    def rolled_back(self, seq_id: int, pos: int) -> None:
        """The sequence now ends at `pos`: its records are cut there, and checkpoints after it go."""
        kept = []
        for c in self._by_seq.get(seq_id, ()):
            if c.pos > pos:
                continue
            c.steps = [s for s in c.steps if s.pos0 < pos]
            if c.steps and c.steps[-1].end > pos:
                s = c.steps[-1]
                n = pos - s.pos0
                ids = None if s.token_ids is None else s.token_ids[:n]
                c.steps[-1] = RecordedStep(s.pos0, s.rows[:n], ids, cut_groups(s.groups, n))
            kept.append(c)
        if kept:
            self._by_seq[seq_id] = kept
        else:
            self.forget(seq_id)

    def forget(self, seq_id: int) -> None:
        """Drop the sequence's checkpoints (it was cleared, released or restored)."""
        self._by_seq.pop(seq_id, None)

    def clear(self) -> None:
        """Drop every checkpoint (the span's executor was replaced)."""
        self._by_seq.clear()


def cut_groups(groups: Sequence[int], n: int) -> tuple[int, ...]:
    """The first `n` rows of sub-steps `groups`, in the same groups: (3, 3, 2) cut at 4 is (3, 1).

    Raises:
        ValueError: n < 1 or more rows than the groups hold.
    """
    if not 1 <= n <= sum(groups):
        raise ValueError(f"cut {n} rows of groups {tuple(groups)}")
    out, left = [], n
    for g in groups:
        out.append(min(g, left))
        left -= out[-1]
        if not left:
            break
    return tuple(out)


def replay(executor: SpanExecutor, seq_id: int, rollback: Rollback) -> None:
    """Roll `seq_id` back as `rollback` says: clear it, import the checkpoint, compute the kept
    rows again. Blocking: run it on the executor thread.

    Raises:
        ExecutorError: the import or a step failed; the sequence is left empty (the caller empties
            the session too: its client's next step then fails and the route is rebuilt).
    """
    try:
        executor.clear(seq_id)
        executor.import_seq(seq_id, rollback.state)
        for s in rollback.steps:
            n = min(s.rows.shape[0], rollback.pos - s.pos0)
            a = 0
            for g in cut_groups(s.groups, n):
                ids = None if s.token_ids is None else s.token_ids[a : a + g]
                executor.forward(seq_id, s.pos0 + a, s.rows[a : a + g], token_ids=ids)
                a += g
        if executor.pos_max(seq_id) != rollback.pos - 1:
            raise ExecutorError(f"sequence {seq_id} ends at {executor.pos_max(seq_id) + 1} after the "
                                f"rollback, not {rollback.pos}")
    except ExecutorError:
        executor.clear(seq_id)
        raise
