"""What one verify pass sends and what it accepts (pure).

A verify pass carries `1 + len(draft)` rows through every hop in one frame: the last accepted token
(not yet in any hop's KV cache) and the drafted tokens after it, at positions pos..pos+k. The last
span samples every row as a one-token decode step would have at that position (row i gives the
token at position pos + i + 1, drawn with the per-position seed of swarm/sampling.py), and answers
those k + 1 tokens. The client keeps drafted token j while it equals the token the last span sampled
after row j - 1, then the last span's token after the last kept row: 1..k+1 new tokens per pass, each
exactly the token non-speculative decoding would have produced from the same logits. This holds for
greedy and for seeded sampling alike: with a draft that is a single guess (prompt lookup, or a draft
model's greedy choice), "accept with probability min(1, p/q), else resample from the residual" is the
same as "draw from p and accept when the draw equals the guess" (q is a point mass: accept with
probability p(guess); on rejection the residual is p without the guess, renormalised), and the seeded
draw makes it the very draw the non-speculative run makes.

Exactness of the logits themselves: llama.cpp rounds a step of many rows differently from one-row
steps (ggml-cpu picks its matmul kernel by row count; swarm/route/replay.py has the figures), so
a verify pass is computed as steps of at most `group_rows` rows (`Forward.steps`). With group_rows 1
every row is computed exactly as a decode step, on every model; a larger group is exact only where
the kernels make it so (docs/speculative.md has the measured agreement per model).

The hops keep the kept rows and roll the rest back: the client's next Forward starts at pos + kept
with `rewind` (swarm/client/session.py `RouteSession.keep`).

This module does not: draft (draft.py), sample (the last span does) or send anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarm.limits import MAX_VERIFY_ROWS


def draft_budget(k_max: int, generated: int, max_new_tokens: int) -> int:
    """Drafted tokens worth sending now: at most `k_max`, and never more than the request can still
    use (a pass yields up to k + 1 tokens) nor MAX_VERIFY_ROWS - 1.

    Args:
        k_max: the configured draft length.
        generated: tokens generated so far (the last one not yet computed by the route).
        max_new_tokens: the request's cap.
    Returns:
        k >= 0; 0 means decode one token instead. The pass's rows then end at position
        prompt + generated - 1 + k < prompt + max_new_tokens, inside the session's reservation.
    """
    return max(0, min(k_max, max_new_tokens - generated - 1, MAX_VERIFY_ROWS - 1))


def verify_steps(n_rows: int, group_rows: int) -> tuple[int, ...]:
    """The row counts of the steps a verify pass of `n_rows` rows is computed as (`Forward.steps`):
    groups of `group_rows`, the last one shorter; () when that is one step.

    Raises:
        ValueError: n_rows or group_rows < 1.
    """
    if n_rows < 1 or group_rows < 1:
        raise ValueError(f"need n_rows >= 1 and group_rows >= 1, got {n_rows}, {group_rows}")
    if group_rows >= n_rows:
        return ()
    full, rest = divmod(n_rows, group_rows)
    return (group_rows,) * full + ((rest,) if rest else ())


def accepted(draft: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """The new tokens a verify pass yields.

    Args:
        draft: the k drafted tokens (rows 1..k of the pass; row 0 is the last accepted token).
        sampled: the k + 1 tokens the last span sampled after rows 0..k.
    Returns:
        draft[:a] + [sampled[a]], where a is the number of leading drafted tokens equal to the token
        sampled after the row before them: 1..k+1 tokens.
    Raises:
        ValueError: len(sampled) != len(draft) + 1.
    """
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"{len(draft)} drafted tokens need {len(draft) + 1} sampled, got {len(sampled)}")
    a = 0
    while a < len(draft) and draft[a] == sampled[a]:
        a += 1
    return [*draft[:a], sampled[a]]


@dataclass
class Acceptance:
    """Speculation counts of one generation (Generation Telemetry's `speculation`).

    Attributes:
        passes: verify passes sent.
        drafted: drafted tokens sent in them.
        accepted: drafted tokens kept.
        ahead_sent: passes sent ahead, behind a pass still in flight (pipelining).
        ahead_used: of them, the ones whose answers were used (the rest were rolled back unread).
    """

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    ahead_sent: int = 0
    ahead_used: int = 0

    def add(self, drafted: int, kept: int) -> None:
        """Count one pass of `drafted` drafted tokens of which `kept` were kept."""
        self.passes += 1
        self.drafted += drafted
        self.accepted += kept

    @property
    def rate(self) -> float:
        """Kept / drafted (0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per verify pass: kept drafted tokens + the one the last span adds (0 before any)."""
        return (self.accepted + self.passes) / self.passes if self.passes else 0.0
