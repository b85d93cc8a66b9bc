"""Restore arithmetic of a route session: where newly opened hops start, and what is replayed.

Hops opened with the prompt's prefix offers (swarm/kv/prefix.py) say which prefix lengths they can
restore from a snapshot; new hops start from the largest length all of them can restore, and only
the rows after it are replayed. A replacement hop must restore at least up to the failed hop's
first recorded row (`base`): the rows before it were never recorded, so nothing could replay them.

This module does not: open hops, send frames, or read the prompt (its caller passes the rows in).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from swarm.kv.prefix import choose_restore
from swarm.route.replay import clip_steps


class CannotRestore(Exception):
    """New hops cannot restore a prefix of at least `base` tokens: the failed hop's rows before
    `base` were never recorded, so the whole route must be rebuilt from the prompt."""


def restore_point(
    restorable: Sequence[Collection[int]], base: int, pos: int, prompt_tokens: int | None
) -> int:
    """The prefix length new hops start from.

    Args:
        restorable: per new hop, the prefix lengths (tokens) its peer said it can restore.
        base: position of the first recorded row the new hops replace (0: all rows are recorded).
        pos: tokens the route holds now.
        prompt_tokens: the whole prompt's length, the last prefix offered; None: nothing offered.
    Returns:
        The largest length all hops can restore in [base, pos], below the whole prompt (at the
        first open, base = pos = 0, any offered length); 0 for none when base is 0.
    Raises:
        CannotRestore: base > 0 and there is no such length.
    """
    if prompt_tokens is None:
        if base:
            raise CannotRestore()
        return 0
    usable = [frozenset(n for n in r if base <= n <= pos or (base == 0 and pos == 0)) for r in restorable]
    restore = choose_restore(usable, below=prompt_tokens)
    if base and restore < base:
        raise CannotRestore()
    return restore


def rebuild_rows(
    prefix: np.ndarray | None, recorded: Sequence[np.ndarray], n_recorded: int, chunk_tokens: int
) -> list[np.ndarray] | None:
    """What a route rebuilt over every layer replays: the first hop's rows.

    Args:
        prefix: `[base, hidden]` float32, the embedded prompt rows the first hop restored and never
            computed (None: it restored nothing); replayed in prefill chunks of `chunk_tokens`.
        recorded: the first hop's recorded steps, one `[rows, hidden]` block each, from position base.
        n_recorded: rows of `recorded` to replay (pos - base).
    Returns:
        One block per step, in position order; None when there is nothing to replay.
    """
    rows = [] if prefix is None else [
        prefix[i : i + chunk_tokens] for i in range(0, prefix.shape[0], chunk_tokens)
    ]
    rows += clip_steps(recorded, 0, n_recorded)
    return rows or None
