"""Checking remote computation: when to check a hop, how to compare, and what a caught peer costs.

A client records every hop's input rows (for failover replay, swarm/route/replay.py), and a hop's
output is the next hop's recorded input. A spot check sends one hop's recorded rows since its
previous check, up to the step being checked, to a session on another peer (or chain of peers) of
the same layers that holds the rows before them (kept from that earlier check; from position 0 the
first time), as a prefill (or as the recorded steps, `CheckPolicy.regroup` off), and compares every
row's output with what the checked peer returned (swarm/client/checks.py does the I/O). This module holds the pure
parts:

- `compare`: the measure between a claimed and a recomputed block of hidden states: per row, the
  relative L2 distance ||claimed - ref|| / ||ref|| and the cosine similarity; the worst row decides.
  Why these and not TOPLOC's top-k values: what moves honest rows is rounding spread over every
  element (a replay of the recorded steps is bit-equal on one kind of machine; the default
  one-prefill check groups the rows otherwise and moves them by up to rel L2 0.0185; another
  attention kernel by 0.0216), which a relative L2 bounds directly, while a top-k comparison would
  miss a lie that leaves the largest elements alone (noise added to the small ones, or a lower
  quantization that keeps the outliers) and needs a k and a value tolerance besides. Cosine is
  reported beside it; it ignores a change of scale, which rel L2 does not.
- `compare_tokens`: the last hop answers tokens, not hidden states; its check replays the recorded
  steps exactly (each as it was computed), so an honest checker draws the same token at every
  position and any difference is a lie.
- `Measure.first_outside`, `rewind_position`: from which position a hop's output is first wrong,
  so the client knows how far back its text is poisoned and recomputes from there (the repair).
- `Band`: the largest honest distance accepted, per model architecture and quantization type;
  calibrated from honest runs (the benchmark prints the measured distribution and the margin).
- `CheckPolicy`, `CheckSchedule`: which decode steps start a check (one early, then at a random
  rate, from a seeded RNG so a test is deterministic) and which hop it checks (round robin).
- `Standing`: offences per peer over time, as extra cost in route planning (`plan_route`'s
  `penalty_ms`), so a peer caught again and again loses its place in routes even after its
  exclusion ends.

This module does not: open sessions, send frames, read a clock or draw from a global RNG.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import gguf
import numpy as np

DEFAULT_CHECK_RATE = 0.03
"""Probability that a decode step starts a spot check (when none is running)."""

FIRST_CHECK_STEP = 2
"""The decode step that always starts a check: an always-lying peer is caught in its first tokens."""

SWEEP_STEPS = 40
"""Decode steps between sweeps (every hop checked again) after the first check. A check compares
every row the hop computed so far, so a peer that lies now and then is caught by the sweep after
its first lie, not only if a random check happens to fall on its hop after it (with three hops and
the default rate, a 1-in-10 liar on one of them went uncaught in 1 generation of 3). Measured
price (docs/benchmarks.md "Verification"): on a 2-core machine whose checkers share the route's
cores, 2.8-12.5% of decode tokens/s in 4 runs, against 4.3-13.1% for the default rate without
sweeps in 4 runs of the same hour: not separable from the noise."""

OFFENCE_PENALTY_MS = 1000.0
"""Route cost added per recorded offence of a peer (within the standing window), ms per step."""


@dataclass(frozen=True)
class Band:
    """The tolerance of a check: honest replays stay inside, lies fall outside.

    Attributes:
        max_rel_l2: largest per-row ||claimed - ref|| / ||ref|| accepted.
        min_cosine: smallest per-row cosine similarity accepted.
        source: where the numbers come from (the calibration run).
    """

    max_rel_l2: float
    min_cosine: float
    source: str = ""


BANDS: dict[tuple[str, str], Band] = {
    ("llama", "MOSTLY_Q4_1"): Band(
        max_rel_l2=0.03, min_cosine=0.9995,
        source="SmolLM2-135M Q4_1, span 10:20: honest checks (one prefill) over threads 1 and 2 and "
               "batches of 1 to 8 sessions at most rel L2 0.0184, cosine 0.99984 (3,384 decode steps, "
               "0 flagged); flash attention off (another kernel's rounding) 0.0216 (scripts/bench_verify.py)",
    ),
    ("qwen2", "MOSTLY_Q4_K_M"): Band(
        max_rel_l2=0.03, min_cosine=0.9995,
        source="Qwen2.5-Coder-0.5B Q4_K_M, span 8:16: one prefill against the client's steps rel L2 "
               "0.0156, cosine 0.99988; flash attention off 0.0157 (scripts/bench_verify.py)",
    ),
}
"""(architecture, quantization type) → the band calibrated from honest runs of that model."""

DEFAULT_BAND = Band(max_rel_l2=0.03, min_cosine=0.9995,
                    source="the calibrated models' band, for a model and quantization not calibrated yet")
"""The band `band_for` falls back to."""


def quant_type(hparams: dict) -> str:
    """The quantization type of a model from its manifest's hparams (`general.file_type`, a
    llama.cpp ftype number) as its name, e.g. "MOSTLY_Q4_1"; "" when absent or unknown."""
    try:
        return gguf.LlamaFileType(int(hparams.get("general.file_type", -1))).name
    except (ValueError, TypeError):
        return ""


def band_for(arch: str, quant: str) -> Band:
    """The band calibrated for a model's architecture and quantization type (GGUF file type name)."""
    return BANDS.get((arch, quant), DEFAULT_BAND)


@dataclass(frozen=True)
class Measure:
    """How far a claimed block of hidden states is from its recomputation.

    Attributes:
        rel_l2: the worst row's ||claimed - ref|| / ||ref|| (inf for a non-finite claimed row).
        cosine: the worst row's cosine similarity (-1 for a non-finite claimed row).
        row: index of the worst row (by rel_l2) in the compared block.
        first_outside: index of the first row outside the band `compare` was given (its rel L2
            over `max_rel_l2` or its cosine under `min_cosine`); -1: none, or no band given. A
            check adds the position of the block's first row, so this is the first wrong position.
    """

    rel_l2: float
    cosine: float
    row: int
    first_outside: int = -1

    def within(self, band: Band) -> bool:
        """Whether the claimed rows pass `band`."""
        return self.rel_l2 <= band.max_rel_l2 and self.cosine >= band.min_cosine


def compare(claimed: np.ndarray, ref: np.ndarray, band: Band | None = None) -> Measure:
    """Compare the hidden states a peer returned with a recomputation of the same steps.

    Args:
        claimed, ref: `[rows, hidden]` float32, same shape.
        band: the tolerance that decides `first_outside`; None: not asked (-1).
    Returns:
        Measure: the worst row's relative L2 and cosine, and the first row outside `band`.
    Raises:
        ValueError: shapes differ or are empty.
    """
    if claimed.shape != ref.shape or claimed.ndim != 2 or claimed.shape[0] == 0:
        raise ValueError(f"cannot compare blocks of shapes {claimed.shape} and {ref.shape}")
    a, b = claimed.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(a).all(axis=1)
    ref_norm = np.maximum(np.linalg.norm(b, axis=1), 1e-30)
    with np.errstate(invalid="ignore", over="ignore"):
        rel = np.where(finite, np.linalg.norm(a - b, axis=1) / ref_norm, math.inf)
        cos = np.where(finite, (a * b).sum(axis=1) / (np.maximum(np.linalg.norm(a, axis=1), 1e-30) * ref_norm),
                       -1.0)
    row = int(np.argmax(rel))
    first = -1
    if band is not None:
        outside = np.flatnonzero((rel > band.max_rel_l2) | (cos < band.min_cosine))
        first = int(outside[0]) if outside.size else -1
    return Measure(rel_l2=float(rel[row]), cosine=float(cos.min()), row=row, first_outside=first)


def compare_tokens(claimed: Mapping[int, int], ref: Mapping[int, int]) -> Measure:
    """Compare the tokens a last hop answered with a recomputation of the same steps.

    A last hop's replay on an honest checker (its recorded steps, each computed as it was) gives the
    same logits bit for bit, and the same seeded draw, so any token that differs is wrong: no band.

    Args:
        claimed, ref: position -> token id (the token at that position, sampled after the row at
            position - 1); positions only one of them holds are not compared.
    Returns:
        Measure: rel_l2 0 and cosine 1 when every common position agrees; else inf and -1, with
        `row` and `first_outside` the row (position - 1) that yielded the first differing token.
    """
    wrong = [p for p in sorted(claimed.keys() & ref.keys()) if claimed[p] != ref[p]]
    if not wrong:
        return Measure(rel_l2=0.0, cosine=1.0, row=0)
    return Measure(rel_l2=math.inf, cosine=-1.0, row=wrong[0] - 1, first_outside=wrong[0] - 1)


def rewind_position(first_outside: int, prompt_tokens: int, pos: int) -> int:
    """Where a route rolls its text back to when a hop's output is first wrong at `first_outside`.

    The row at position p yields the token at position p + 1, so a wrong row p makes every token
    from p + 1 on suspect (later rows were computed from them), while the rows before p, and the
    tokens they yielded, stand. The prompt's rows are the user's, and its first token comes after
    the last of them, so a lie inside the prompt rolls back to the prompt's end.

    Args:
        first_outside: position of the hop's first row outside the band (`Measure.first_outside`,
            >= 0).
        prompt_tokens: the prompt's length, tokens.
        pos: tokens the route holds now.
    Returns:
        The number of tokens (prompt + generated) that stand: the route recomputes the token at
        this position and every later one; in [prompt_tokens, pos] (pos when prompt_tokens > pos).
    """
    return min(pos, max(first_outside + 1, prompt_tokens))


@dataclass(frozen=True)
class CheckPolicy:
    """How often a client checks its hops, and what a caught peer costs.

    Attributes:
        rate: probability that a decode step starts a check when none is running (0: only the
            first check).
        first_check_step: the decode step (0-based) that always starts a check of every hop; -1:
            none, and no sweeps (checks at `rate` only).
        sweep_steps: every this many decode steps after the first check, every hop is checked
            again (`SWEEP_STEPS`; 0: only the first check).
        seed: seed of the schedule's RNG (None: drawn from the system's entropy).
        caught_exclusion_s: how long this client leaves a caught peer out of its routes, seconds
            (a restart does not end it).
        penalty_ms: route cost per offence, ms (`Standing.penalties`).
        standing_window_s: offences older than this no longer count, seconds.
        regroup: a check sends the hop's rows as one prefill (cheap; rows grouped otherwise than
            the checked peer computed them, so the band must cover the rounding that costs);
            False: as the recorded steps (bit-exact on one kind of machine, one row per step).
        verify_prefill: check every hop's prompt rows before the first token is given out, so a
            peer lying from its first answer cannot change any token (costs TTFT: one prefill of
            each checked span on its checker, waited for).
        settle_at_end: the generation ends only when the checks in flight have answered; one
            that caught a hop then rolls the text back and the generation goes on from the first
            wrong row, so a verdict after the last token still repairs it (costs the rest of that
            check's time at the end, only when one is in flight). False: checks in flight at the
            end are dropped, and a peer they would have caught keeps its tokens in this text.
    """

    rate: float = DEFAULT_CHECK_RATE
    first_check_step: int = FIRST_CHECK_STEP
    sweep_steps: int = SWEEP_STEPS
    seed: int | None = None
    caught_exclusion_s: float = 3600.0
    penalty_ms: float = OFFENCE_PENALTY_MS
    standing_window_s: float = 7 * 24 * 3600.0
    regroup: bool = True
    verify_prefill: bool = False
    settle_at_end: bool = True

    def __post_init__(self):
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"check rate must be in [0, 1], got {self.rate}")
        if self.sweep_steps < 0:
            raise ValueError(f"sweep_steps must be >= 0, got {self.sweep_steps}")


class CheckSchedule:
    """Which decode steps of one generation start a check, and of which hop.

    The first check comes at `first_check_step` and again every `sweep_steps` after it: a sweep,
    in which the client checks every hop. Any other decode step after the first check starts a
    check of one hop with probability `rate`, drawn from `rng` (seeded by the policy for tests and
    benchmarks). Those hops are taken in turn from a random first one, so every checkable hop is
    checked as often.
    """

    def __init__(self, policy: CheckPolicy, rng: random.Random):
        self.policy, self._rng = policy, rng
        self._turn = rng.randrange(1 << 30)

    def due(self, decode_step: int) -> Literal["sweep", "one"] | None:
        """What decode step `decode_step` (0-based) starts: a sweep of every hop, a check of one, or
        nothing (one draw per call)."""
        draw = self._rng.random()
        first, every = self.policy.first_check_step, self.policy.sweep_steps
        since = decode_step - first
        if first >= 0 and since >= 0 and (since == 0 or (every and since % every == 0)):
            return "sweep"
        return "one" if decode_step > first and draw < self.policy.rate else None

    def pick(self, checkable: Sequence[int]) -> int:
        """The next hop index to check among `checkable` (non-empty), in turn."""
        self._turn += 1
        return checkable[self._turn % len(checkable)]


class Standing:
    """Offences of peers caught outside the band, shared by a client's sessions.

    `penalties(now_s)` gives the planner an extra cost per peer: `penalty_ms` for each offence in
    the last `standing_window_s`, so a peer caught twice is avoided twice as strongly.
    """

    def __init__(self, policy: CheckPolicy):
        self.policy = policy
        self._times: dict[str, list[float]] = {}

    def record(self, peer_id: str, now_s: float) -> int:
        """Count one offence of `peer_id` at `now_s`; returns its offences in the window."""
        times = self._times.setdefault(peer_id, [])
        times.append(now_s)
        return self.offences(peer_id, now_s)

    def offences(self, peer_id: str, now_s: float) -> int:
        """Offences of `peer_id` in the window ending at `now_s`."""
        cutoff = now_s - self.policy.standing_window_s
        times = [t for t in self._times.get(peer_id, []) if t > cutoff]
        if times:
            self._times[peer_id] = times
        else:
            self._times.pop(peer_id, None)
        return len(times)

    def penalties(self, now_s: float) -> dict[str, float]:
        """Peer id → extra route cost in ms per step, for peers with offences in the window."""
        out = {}
        for peer_id in list(self._times):
            n = self.offences(peer_id, now_s)
            if n:
                out[peer_id] = n * self.policy.penalty_ms
        return out
