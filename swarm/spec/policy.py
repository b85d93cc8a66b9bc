"""Adaptive draft length: how many tokens to draft before each pass through the route.

A verify pass with k drafted rows costs more than a one-row decode step (more rows on every hop,
and the draft's own time), and yields, when each drafted token is accepted with probability a
independently of the others, E(k) = (1 - a^(k+1)) / (1 - a) tokens (Leviathan, Kalman and Matias,
"Fast Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1). `KPolicy` picks the
k in 0..k_max with the most tokens per millisecond, E(k) / T(k), where T(k) = fixed + k * per_row
is fitted to the passes of this generation (a plain decode step is the pass with k = 0) and the
draft's own cost is measured per drafted token. k = 0 is plain decoding: speculation switches
itself off where it would be slower (low acceptance where a row costs about as much as a step, as
on one machine's loopback) and stays on where round trips dominate a pass (a WAN), as measured.

While off, the draft still proposes now and then (shadow drafts, every `probe_every` steps): each
is compared with the tokens then decoded, so the acceptance keeps being learned at no cost to the
route, and speculation comes back when the text starts to copy its context. A draft model's shadow
is not free: it first catches up on every token decoded since its last proposal, so shadows are
drawn only from drafts that cost at most SHADOW_SHARE of a plain step per token (prompt lookup); a
draft model's acceptance hardly depends on whether the text copies, and its passes measured it.

This module does not: time anything, draft, or touch the route. The generation loop
(swarm/client/generate.py) feeds it measurements in ms and asks it for k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DECAY = 0.9
"""Weight left to an earlier observation at each new one: the fit follows about the last 10 passes
(the route, its load and the text's predictability drift within one generation)."""

SHADOW_SHARE = 0.05
"""Shadow drafts only from a draft whose time per drafted token is at most this share of a plain
step: a shadow then costs at most about that share of the steps it spans (the draft catches up on
each of them). Prompt lookup: next to nothing; a self-draft: about a step."""

PRIOR_ACCEPTANCE = 0.5
"""Acceptance assumed before any draft was checked, worth `PRIOR_WEIGHT` drafted tokens."""
PRIOR_WEIGHT = 2.0


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one verify pass of `k` drafted rows yields on average (the accepted drafts plus the
    token the last span samples after them) when each draft is accepted with probability
    `acceptance` independently: sum of acceptance^i for i = 0..k (Leviathan et al. 2023, eq. 1)."""
    return sum(acceptance**i for i in range(k + 1))


@dataclass
class _Fit:
    """Decayed least squares of pass time (ms) on drafted rows: T(k) = fixed + k * per_row."""

    w: float = 0.0
    sk: float = 0.0
    st: float = 0.0
    skk: float = 0.0
    skt: float = 0.0

    def add(self, k: int, ms: float) -> None:
        for name in ("w", "sk", "st", "skk", "skt"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.w += 1.0
        self.sk += k
        self.st += ms
        self.skk += k * k
        self.skt += k * ms

    def line(self) -> tuple[float, float] | None:
        """(fixed ms, per_row ms), or None before a pass of k = 0 and one of k > 0 were seen (the
        slope is unknown until then)."""
        var = self.skk * self.w - self.sk * self.sk
        if self.w == 0.0 or var <= 1e-9 * max(1.0, self.skk * self.w):
            return None
        per_row = max(0.0, (self.skt * self.w - self.sk * self.st) / var)
        fixed = max(1e-3, (self.st - per_row * self.sk) / self.w)
        return fixed, per_row


@dataclass
class KPolicy:
    """Chooses the draft length of each pass of one generation from what its passes measured.

    Args:
        k_max: most drafted tokens per pass (the request's `k`), >= 1.
        probe_every: while off (k = 0), a shadow draft every this many steps (>= 1).
        explore: drafted tokens of the exploring pass, 1..k_max (None: k_max).
    Until both a plain step and a verify pass were timed it explores: the first decode step is
    plain, the next pass drafts `explore` tokens. The generation passes one less than the route's
    exact row group (swarm/spec/verify.py), so the exploring pass costs each hop one step of rows:
    where guesses turn out poor, finding out costs about one plain step, not one per row group
    (Qwen's repacked kernels: a 5-row pass is two steps of rows, about three plain steps at 0 ms).
    """

    k_max: int
    probe_every: int = 8
    explore: int | None = None
    _fit: _Fit = field(default_factory=_Fit)
    _accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT
    _rejected: float = (1.0 - PRIOR_ACCEPTANCE) * PRIOR_WEIGHT
    _draft_ms_per_token: float = 0.0
    _since_probe: int = 0

    def __post_init__(self) -> None:
        if self.k_max < 1 or self.probe_every < 1:
            raise ValueError(f"need k_max >= 1 and probe_every >= 1, got {self.k_max}, {self.probe_every}")
        if self.explore is None:
            self.explore = self.k_max
        if not 1 <= self.explore <= self.k_max:
            raise ValueError(f"need 1 <= explore <= k_max, got explore {self.explore}, k_max {self.k_max}")

    @property
    def acceptance(self) -> float:
        """Estimated probability that one drafted token is accepted (the geometric model's a)."""
        return self._accepted / (self._accepted + self._rejected)

    def choose(self) -> int:
        """Drafted tokens for the next pass, 0..k_max (0: a plain decode step)."""
        line = self._fit.line()
        if line is None:
            return 0 if self._fit.w == 0.0 else self.explore
        fixed, per_row = line
        a = min(self.acceptance, 1.0 - 1e-6)
        rate = [
            expected_tokens(a, k) / (fixed + k * (per_row + self._draft_ms_per_token))
            for k in range(self.k_max + 1)
        ]
        return max(range(self.k_max + 1), key=lambda k: (rate[k], -k))

    def wants_shadow(self) -> bool:
        """After `choose()` said 0: whether to draft anyway, only to learn the acceptance: every
        `probe_every` steps, and never from a draft that costs more than SHADOW_SHARE of a plain
        step per token."""
        line = self._fit.line()
        if line is not None and self._draft_ms_per_token > SHADOW_SHARE * line[0]:
            return False
        self._since_probe += 1
        if self._since_probe < self.probe_every:
            return False
        self._since_probe = 0
        return True

    def observe_pass(self, drafted: int, kept: int, ms: float) -> None:
        """A pass through the route finished: `drafted` rows drafted (0: a plain step), `kept` of
        them accepted, in `ms` milliseconds (the draft's own time excluded)."""
        self._fit.add(drafted, ms)
        if drafted:
            self.observe_acceptance(drafted, kept)

    def observe_acceptance(self, drafted: int, kept: int) -> None:
        """`kept` of `drafted` tokens were accepted (a verify pass, or a shadow draft compared with
        the tokens decoded after it). Under the geometric model every kept token is a success and
        the first rejected one, if any, a failure (the ones after it were never tried)."""
        self._accepted = self._accepted * DECAY + kept
        self._rejected = self._rejected * DECAY + (1.0 if kept < drafted else 0.0)

    def observe_draft(self, proposed: int, ms: float) -> None:
        """The draft took `ms` to propose `proposed` tokens (a draft model costs per token; a
        prompt lookup next to nothing)."""
        if proposed:
            per = ms / proposed
            self._draft_ms_per_token = per if self._draft_ms_per_token == 0.0 else (
                DECAY * self._draft_ms_per_token + (1.0 - DECAY) * per)


AHEAD_MIN_USE = 0.4
"""Send a pass ahead (pipelining) only when it is at least this likely to be used: a pass sent ahead
that is not used cost every hop its rows' compute for nothing."""


def worth_sending_ahead(acceptance: float, k: int) -> bool:
    """Whether to send the next verify pass ahead, behind a pass of `k` drafted tokens still in
    flight. It is used only when that pass keeps all k drafts and the guess of the token after them
    holds: k + 1 guesses, each kept with probability `acceptance` under the geometric model (see
    `expected_tokens`), so acceptance^(k+1) >= AHEAD_MIN_USE."""
    return acceptance ** (k + 1) >= AHEAD_MIN_USE


def shadow_kept(proposal: Sequence[int], decoded: Sequence[int]) -> int | None:
    """How many tokens of a shadow draft the decoding that followed it confirmed, or None while
    that is not known yet (`decoded`, the tokens decoded since the draft, agrees with all of
    `proposal` that it covers and is shorter)."""
    for i, (p, d) in enumerate(zip(proposal, decoded)):
        if p != d:
            return i
    return len(proposal) if len(decoded) >= len(proposal) else None
